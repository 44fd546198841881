//! A real PostgreSQL server for tests and benchmarks: the distribution's `postgresql` package,
//! `initdb` into a temporary directory, listening on an ephemeral loopback port, run as the
//! unprivileged `postgres` user when the tests run as root; and a real PgBouncer in front of
//! it, in transaction-pooling mode, as managed set-ups put one.
//!
//! The server is watched by a small supervisor reading its stdin from this process: when this
//! process exits — tests done, a panic, even `kill -9` — the pipe closes and the supervisor
//! stops the server and deletes its directory, so no server outlives its tests.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// The superuser `initdb` creates.
const USER: &str = "uncaged";

/// A running server.
pub struct PgServer {
    pub port: u16,
    /// Where its Unix socket is (what [`PgServer::sql`] connects through: a server that
    /// takes TCP connections over TLS only still trusts it).
    socket_dir: PathBuf,
    /// Keeps the supervisor's stdin open: dropping it stops the server.
    supervisor: Child,
    databases: AtomicUsize,
    /// A database every new one is copied from (see [`PgServer::prepare_template`]).
    template: std::sync::OnceLock<String>,
    /// [`PgServer::sql`]'s open session to each database: tests poll with it, and a session
    /// per look made the server fork (and tear down) a backend every 20 ms of every test.
    sessions: Mutex<HashMap<String, Arc<tokio_postgres::Client>>>,
}

impl PgServer {
    /// Starts a server with `settings` (`name=value` pairs for `postgres -c`).
    pub fn start(settings: &[&str]) -> Result<PgServer> {
        let bin = bin_dir()?;
        let dir = crate::scratch::tempdir_named("uncaged-pg-")?.keep();
        let as_postgres = running_as_root();
        if as_postgres {
            let owner = Command::new("id").args(["-u", "postgres"]).output()?;
            ensure!(
                owner.status.success(),
                "the `postgres` user does not exist (install postgresql)"
            );
            let uid: u32 = String::from_utf8(owner.stdout)?.trim().parse()?;
            std::os::unix::fs::chown(&dir, Some(uid), None)?;
        }
        let data = dir.join("data");
        new_cluster(&bin, &data, as_postgres)?;
        // An ephemeral port: taken from the kernel, released, handed to the server. Another
        // process could take it meanwhile; then the server fails to start and another is tried.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let mut supervisor = user_command(as_postgres, Path::new("sh"))
                .args(["-c", SUPERVISOR, "supervisor"])
                .arg(bin.join("postgres"))
                .arg(&data)
                .arg(port.to_string())
                .arg(&dir)
                .args(settings)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("start postgres")?;
            let stderr = supervisor.stderr.take().expect("piped");
            let server = PgServer {
                port,
                socket_dir: dir.clone(),
                supervisor,
                databases: AtomicUsize::new(0),
                template: std::sync::OnceLock::new(),
                sessions: Mutex::default(),
            };
            if server.wait_ready(stderr)? {
                return Ok(server);
            }
        }
        bail!("postgres did not start on a free port in 5 tries (see {})", dir.display())
    }

    /// Waits for "ready to accept connections"; false if the server exited first.
    fn wait_ready(&self, stderr: std::process::ChildStderr) -> Result<bool> {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut ready = false;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if !ready && line.contains("ready to accept connections") {
                    ready = true;
                    let _ = sender.send(true);
                }
                if line.contains("could not bind") || line.contains("FATAL") {
                    let _ = sender.send(false);
                }
            }
            let _ = sender.send(false);
        });
        receiver.recv_timeout(Duration::from_secs(60)).context("postgres did not start in 60 s")
    }

    /// A connection string for database `db` of this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a new database and returns its connection string: a copy of the template, when
    /// one was prepared, else empty.
    pub fn new_database(&self) -> Result<String> {
        let name = self.next_name();
        let from = match self.template.get() {
            // A file copy of a small template costs a fraction of PostgreSQL 15's default
            // (which writes each block to the WAL), and of migrating every test's database.
            Some(template) => format!(" TEMPLATE {template} STRATEGY FILE_COPY"),
            None => String::new(),
        };
        self.sql("postgres", &format!("CREATE DATABASE {name}{from}"))?;
        Ok(self.url(&name))
    }

    /// Creates a new database with nothing in it, whatever the template.
    pub fn new_empty_database(&self) -> Result<String> {
        let name = self.next_name();
        self.sql("postgres", &format!("CREATE DATABASE {name}"))?;
        Ok(self.url(&name))
    }

    /// Makes every later [`PgServer::new_database`] a copy of a database that `prepare` was
    /// given (by its connection string) first: the store's schema, migrated once per test
    /// process instead of once per test. The migration from nothing is still run, here.
    pub fn prepare_template(&self, prepare: impl FnOnce(&str) -> Result<()>) -> Result<()> {
        let name = format!("template_{}", std::process::id());
        self.sql("postgres", &format!("CREATE DATABASE {name}"))?;
        prepare(&self.url(&name))?;
        // A template cannot be copied while anyone is connected to it: `prepare` has ended
        // its sessions, but the server may still be closing them.
        self.sql(
            "postgres",
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            ),
        )?;
        self.template.set(name).map_err(|_| anyhow::anyhow!("the template is prepared once"))
    }

    fn next_name(&self) -> String {
        format!("t{}_{}", std::process::id(), self.databases.fetch_add(1, Ordering::SeqCst))
    }

    /// Runs `statements` in database `db`, returning the rows they gave as `psql -A -t`
    /// prints them: one line a row, columns joined by `|`, NULL as nothing. A session of this
    /// process's, kept open per database, rather than `psql` itself: tests poll with it, and a
    /// process per look cost them ~20 ms each. Usable from inside a test's own async runtime.
    pub fn sql(&self, db: &str, statements: &str) -> Result<String> {
        use tokio_postgres::SimpleQueryMessage;
        // A session cut since its last use (a test that ends every session of its database)
        // is opened again, once.
        let mut retried = false;
        let messages = loop {
            let client = self.session(db)?;
            match futures::executor::block_on(client.simple_query(statements)) {
                Ok(messages) => break messages,
                Err(e) if e.is_closed() && !retried => {
                    self.sessions.lock().unwrap().remove(db);
                    retried = true;
                }
                Err(e) => bail!(match e.as_db_error() {
                    Some(db) => format!("{}: {}", db.severity(), db.message()),
                    None => e.to_string(),
                }),
            }
        };
        let mut out = String::new();
        for message in messages {
            if let SimpleQueryMessage::Row(row) = message {
                for column in 0..row.len() {
                    if column > 0 {
                        out.push('|');
                    }
                    out.push_str(row.get(column).unwrap_or_default());
                }
                out.push('\n');
            }
        }
        Ok(out)
    }

    /// The open session to database `db`, connected if there is none (or it closed).
    fn session(&self, db: &str) -> Result<Arc<tokio_postgres::Client>> {
        if let Some(client) = self.sessions.lock().unwrap().get(db)
            && !client.is_closed()
        {
            return Ok(client.clone());
        }
        let mut config = tokio_postgres::Config::new();
        config.host_path(&self.socket_dir).port(self.port).user(USER).dbname(db);
        // Connected, and its connection driven, on the sessions' own runtime.
        let connecting = sessions_runtime().spawn(async move {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = futures::executor::block_on(connecting)?
            .with_context(|| format!("connect to database {db:?}"))?;
        let client = Arc::new(client);
        self.sessions.lock().unwrap().insert(db.to_string(), client.clone());
        Ok(client)
    }
}

/// The runtime that drives [`PgServer::sql`]'s sessions, on a thread of its own.
fn sessions_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("pg-sessions")
            .enable_all()
            .build()
            .expect("the sessions' runtime")
    })
}

impl Drop for PgServer {
    fn drop(&mut self) {
        stop(&mut self.supervisor, Duration::from_secs(30));
    }
}

/// Stops a supervisor by closing its stdin, and waits (at most `wait`) for it to clean up.
fn stop(supervisor: &mut Child, wait: Duration) {
    drop(supervisor.stdin.take());
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = supervisor.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = supervisor.kill();
}

/// Starts postgres ($1 binary, $2 data dir, $3 port, $4 directory to delete, then settings),
/// waits for stdin to close, stops it (immediate shutdown: test data need no checkpoint) and
/// deletes its directory. Its shared memory segments are files in that directory
/// (`dynamic_shared_memory_type=mmap`), so a server that dies leaves none in `/dev/shm`.
const SUPERVISOR: &str = r#"
pg="$1"; data="$2"; port="$3"; dir="$4"; shift 4
n=$#
for setting do set -- "$@" -c "$setting"; done
shift "$n"
"$pg" -D "$data" -p "$port" -k "$dir" -c listen_addresses=127.0.0.1 \
  -c dynamic_shared_memory_type=mmap "$@" &
server=$!
cat >/dev/null
kill -QUIT "$server" 2>/dev/null
wait "$server"
rm -rf "$dir"
"#;

/// A PgBouncer in transaction-pooling mode in front of a [`PgServer`] (the distribution's
/// `pgbouncer` package): each transaction of a client may run on another server connection,
/// and the pools are small (four server connections per database), so that what needs a
/// session of its own, or holds one too long, shows.
pub struct PgBouncer {
    pub port: u16,
    /// Keeps the supervisor's stdin open: dropping it stops PgBouncer.
    supervisor: Child,
}

impl PgBouncer {
    /// Starts one in front of `server`.
    pub fn start(server: &PgServer) -> Result<PgBouncer> {
        let program = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .map(PathBuf::from)
            .find(|path| path.exists())
            .context("PgBouncer is not installed (`make test` installs the pgbouncer package)")?;
        let dir = crate::scratch::tempdir_named("uncaged-pgbouncer-")?.keep();
        // PgBouncer refuses to run as root: as the server, it runs as `postgres`.
        let as_postgres = running_as_root();
        std::fs::write(dir.join("users.txt"), format!("\"{USER}\" \"\"\n"))?;
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let ini = dir.join("pgbouncer.ini");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     * = host=127.0.0.1 port={server}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = trust\n\
                     auth_file = {users}\n\
                     pool_mode = transaction\n\
                     default_pool_size = 4\n\
                     max_client_conn = 2000\n\
                     query_wait_timeout = 60\n\
                     logfile = {log}\n",
                    server = server.port,
                    users = dir.join("users.txt").display(),
                    log = dir.join("pgbouncer.log").display(),
                ),
            )?;
            if as_postgres {
                let owner = Command::new("id").args(["-u", "postgres"]).output()?;
                let uid: u32 = String::from_utf8(owner.stdout)?.trim().parse()?;
                for path in [dir.clone(), ini.clone(), dir.join("users.txt")] {
                    std::os::unix::fs::chown(&path, Some(uid), None)?;
                }
            }
            let mut supervisor = user_command(as_postgres, Path::new("sh"))
                .args(["-c", BOUNCER_SUPERVISOR, "supervisor"])
                .arg(&program)
                .arg(&ini)
                .arg(&dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start pgbouncer")?;
            // Ready when it accepts connections; a port taken meanwhile makes it exit.
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Ok(PgBouncer { port, supervisor });
                }
                if supervisor.try_wait()?.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = supervisor.kill();
        }
        bail!("pgbouncer did not start in 5 tries (see {})", dir.join("pgbouncer.log").display())
    }

    /// The PgBouncer of this test process, in front of the server `server` gives, started at
    /// first use.
    pub fn shared(
        server: impl FnOnce() -> Result<&'static PgServer>,
    ) -> Result<&'static PgBouncer> {
        static BOUNCER: std::sync::OnceLock<std::result::Result<PgBouncer, String>> =
            std::sync::OnceLock::new();
        BOUNCER
            .get_or_init(|| {
                let server = server().map_err(|e| format!("{e:#}"))?;
                PgBouncer::start(server).map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(|e| anyhow::anyhow!("starting PgBouncer: {e}"))
    }

    /// `url` (a database of the server behind it) as reached through this PgBouncer.
    pub fn url(&self, url: &str) -> Result<String> {
        let (before, db) = url.rsplit_once('/').context("a database URL")?;
        let (host, _port) = before.rsplit_once(':').context("a URL with a port")?;
        Ok(format!("{host}:{}/{db}", self.port))
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        stop(&mut self.supervisor, Duration::from_secs(10));
    }
}

/// Starts pgbouncer ($1 program, $2 configuration, $3 directory to delete), waits for stdin
/// to close, stops it and deletes its directory.
const BOUNCER_SUPERVISOR: &str = r#"
"$1" "$2" &
bouncer=$!
cat >/dev/null
kill -TERM "$bouncer" 2>/dev/null
wait "$bouncer"
rm -rf "$3"
"#;

/// The server's programs: the newest installed `/usr/lib/postgresql/<version>/bin`.
pub fn bin_dir() -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (/usr/lib/postgresql; `make test` installs it)")?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).context("no PostgreSQL server in /usr/lib/postgresql")
}

/// Makes `path` (a file, or a directory) the server's own, readable by it alone (as
/// PostgreSQL wants its TLS key).
pub fn give_to_server(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if running_as_root() {
        let owner = Command::new("id").args(["-u", "postgres"]).output()?;
        let uid: u32 = String::from_utf8(owner.stdout)?.trim().parse()?;
        std::os::unix::fs::chown(path, Some(uid), None)?;
    }
    let mode = if path.is_dir() { 0o700 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Makes a new database cluster at `data`: a copy of one `initdb` made once for this server
/// version and kept in the build's temporary directory. `initdb` costs each test process a
/// second or two of CPU; the copy, a fifth of a second.
fn new_cluster(bin: &Path, data: &Path, as_postgres: bool) -> Result<()> {
    let version = Command::new(bin.join("postgres")).arg("--version").output()?;
    let tag: String = format!("{} {USER}", String::from_utf8_lossy(&version.stdout).trim())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' })
        .collect();
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pg-clusters").join(tag);
    // `cp -a` keeps the owner (the `postgres` user) and the modes the server insists on.
    let copy = |from: &Path, to: &Path| -> Result<bool> {
        Ok(Command::new("cp").arg("-a").arg(from).arg(to).status()?.success())
    };
    if kept.join("PG_VERSION").exists() && copy(&kept, data)? {
        return Ok(());
    }
    let initdb = user_command(as_postgres, &bin.join("initdb"))
        .args(["-D"])
        .arg(data)
        .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null())
        .output()
        .context("run initdb")?;
    ensure!(initdb.status.success(), "initdb failed: {}", String::from_utf8_lossy(&initdb.stderr));
    // Kept by rename, so another test process never copies half a cluster; losing a race to
    // keep one is no matter.
    let parent = kept.parent().expect("a parent");
    std::fs::create_dir_all(parent)?;
    let staging = tempfile::Builder::new().prefix(".cluster-").tempdir_in(parent)?;
    let staged = staging.path().join("data");
    if copy(data, &staged)? {
        let _ = std::fs::rename(&staged, &kept);
    }
    Ok(())
}

/// `program`, run as the `postgres` user when `as_postgres` (the server refuses root).
fn user_command(as_postgres: bool, program: &Path) -> Command {
    if as_postgres {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}
