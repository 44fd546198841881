"""What the notifier's messages reach in the tests (tests/cli/notify.rs): a real SMTP server
(aiosmtpd), a webhook receiver that checks each delivery with the Standard Webhooks library,
a stand-in for Slack's incoming webhooks, and an A2A client's push endpoint (tests/cli/a2a.rs),
each keeping what it is sent. Every message is a
JSON line appended to OUT. Prints `smtp=PORT http=PORT` once both listen.

usage: receivers.py OUT SECRET [--fail-webhooks N]
"""

import email
import email.policy
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller
from standardwebhooks.webhooks import Webhook

OUT, SECRET = sys.argv[1], sys.argv[2]
FAIL_WEBHOOKS = int(sys.argv[sys.argv.index("--fail-webhooks") + 1]) if "--fail-webhooks" in sys.argv else 0
LOCK = threading.Lock()
failed = 0


def keep(record):
    with LOCK, open(OUT, "a") as out:
        out.write(json.dumps(record) + "\n")


class Mail:
    async def handle_DATA(self, server, session, envelope):
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        text = message.get_body(("plain",))
        html = message.get_body(("html",))
        keep({
            "kind": "mail",
            "from": envelope.mail_from,
            "to": envelope.rcpt_tos,
            "subject": str(message["subject"]),
            "messageId": str(message["message-id"]),
            "text": text.get_content() if text else None,
            "html": html.get_content() if html else None,
        })
        return "250 Message accepted for delivery"


class Http(BaseHTTPRequestHandler):
    def do_POST(self):
        global failed
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/webhook":
            with LOCK:
                fail = failed < FAIL_WEBHOOKS
                failed += fail
            if fail:
                keep({"kind": "webhook-refused"})
                self.send_response(503)
                self.end_headers()
                self.wfile.write(b"not now")
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                payload = Webhook(SECRET).verify(body, headers)
                keep({"kind": "webhook", "verified": True, "id": headers["webhook-id"], "payload": payload})
            except Exception as e:  # a delivery that does not verify is kept as such
                keep({"kind": "webhook", "verified": False, "error": str(e)})
            self.send_response(204)
            self.end_headers()
        elif self.path == "/push":
            keep({"kind": "push", "token": self.headers.get("a2a-notification-token"),
                  "payload": json.loads(body)})
            self.send_response(200)
            self.end_headers()
        elif self.path == "/slack":
            keep({"kind": "slack", "payload": json.loads(body)})
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args):
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


smtp = Controller(Mail(), hostname="127.0.0.1", port=free_port())
smtp.start()
http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
threading.Thread(target=http.serve_forever, daemon=True).start()
print(f"smtp={smtp.port} http={http.server_address[1]}", flush=True)
try:
    sys.stdin.read()  # until the test closes our stdin (or dies)
finally:
    smtp.stop()
    http.shutdown()
