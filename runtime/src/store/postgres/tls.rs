//! TLS to the store's database, chosen in the connection string as libpq chooses it:
//! `sslmode=disable|prefer|require|verify-ca|verify-full`, `sslrootcert=PATH|system`, and a
//! client certificate with `sslcert=PATH&sslkey=PATH` (PEM).
//!
//! As with libpq, `prefer` (the default) and `require` encrypt without checking who the server
//! is (unless `sslrootcert` is given, which makes `require` check the chain like `verify-ca`);
//! `verify-ca` checks the server's certificate against the roots, `verify-full` its name too.
//! The roots are the file `sslrootcert` names, or Mozilla's (built in) for `system` or none.
//! tokio-postgres knows neither the `verify-*` modes nor the certificate files, so they are
//! taken out of the string here and the connection is made with `require` and the verifier and
//! certificate they ask for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How the connection is protected, as `sslmode` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// What the connection string asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tls {
    pub mode: Mode,
    /// `sslrootcert`: a PEM file of trusted roots; `None` for Mozilla's (also `system`).
    pub root_cert: Option<PathBuf>,
    /// `sslcert` and `sslkey`: this client's certificate (chain) and private key, as PEM.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl Tls {
    /// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of `url`: the URL
    /// tokio-postgres is given (with the `sslmode` it knows) and what they ask for. Fails with
    /// a line naming the parameter.
    pub fn split(url: &str) -> Result<(String, Tls), String> {
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => return Ok((url.to_string(), Tls::default())),
        };
        let mut tls = Tls::default();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| format!("`{key}` is not UTF-8"))?;
            match key {
                "sslmode" => {
                    tls.mode = match &*decoded {
                        "disable" => Mode::Disable,
                        "allow" | "prefer" => Mode::Prefer,
                        "require" => Mode::Require,
                        "verify-ca" => Mode::VerifyCa,
                        "verify-full" => Mode::VerifyFull,
                        other => {
                            return Err(format!(
                                "sslmode `{other}`: expected disable, prefer, require, verify-ca \
                                 or verify-full"
                            ));
                        }
                    };
                }
                "sslrootcert" if &*decoded == "system" => tls.root_cert = None,
                "sslrootcert" => tls.root_cert = Some(PathBuf::from(&*decoded)),
                "sslcert" => tls.client_cert = Some(PathBuf::from(&*decoded)),
                "sslkey" => tls.client_key = Some(PathBuf::from(&*decoded)),
                _ => kept.push(pair),
            }
        }
        if tls.client_cert.is_some() != tls.client_key.is_some() {
            return Err("a client certificate needs both sslcert and sslkey".into());
        }
        kept.push(match tls.mode {
            Mode::Disable => "sslmode=disable",
            Mode::Prefer => "sslmode=prefer",
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => "sslmode=require",
        });
        Ok((format!("{base}?{}", kept.join("&")), tls))
    }

    /// The TLS connector these settings ask for. Fails with a line if the roots do not read.
    pub fn connector(&self) -> Result<MakeRustlsConnect, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verify_chain = match self.mode {
            Mode::VerifyCa | Mode::VerifyFull => true,
            // As libpq: a root certificate given makes `require` check the chain.
            Mode::Require | Mode::Prefer => self.root_cert.is_some(),
            Mode::Disable => false,
        };
        let chain = match verify_chain {
            true => Some(
                WebPkiServerVerifier::builder_with_provider(self.roots()?, provider.clone())
                    .build()
                    .map_err(|e| format!("TLS roots: {e}"))?,
            ),
            false => None,
        };
        let verifier = Arc::new(Verifier {
            chain,
            check_name: self.mode == Mode::VerifyFull,
            algorithms: provider.signature_verification_algorithms,
        });
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let chain = certificates("sslcert", cert)?;
                check_private(key)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("sslkey {}: {e}", key.display()))?;
                config.with_client_auth_cert(chain, key).map_err(|e| format!("sslkey: {e}"))?
            }
            _ => config.with_no_client_auth(),
        };
        Ok(MakeRustlsConnect::new(config))
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, String> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            Some(path) => {
                let (added, _) =
                    roots.add_parsable_certificates(certificates("sslrootcert", path)?);
                if added == 0 {
                    return Err(format!("sslrootcert {}: no usable certificate", path.display()));
                }
            }
        }
        Ok(Arc::new(roots))
    }
}

/// How the server's certificate is checked: its chain against the roots (`verify-ca`,
/// `verify-full`, or any mode given `sslrootcert`), its name too (`verify-full`), or not at
/// all (`prefer` / `require` without roots: encrypted, but any certificate accepted — what
/// libpq does for these modes). The handshake's signatures are checked either way.
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The certificates of the PEM file `path`, which parameter `param` names; at least one.
fn certificates(param: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{param} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{param} {}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// Refuses a private key others may read, as libpq does: group or world access to it (other
/// than root's group, for a key root owns) means it is not private.
fn check_private(key: &Path) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(key).map_err(|e| format!("sslkey {}: {e}", key.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    let allowed = if meta.uid() == 0 { 0o640 } else { 0o600 };
    if mode & !allowed != 0 {
        return Err(format!(
            "sslkey {}: others may read it (mode {mode:o}); `chmod 600` it",
            key.display()
        ));
    }
    Ok(())
}

/// Whether a connection error is the server's certificate being refused.
pub fn is_untrusted(e: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        // An I/O error's `source` skips the error it wraps: look inside it.
        let inner = cause.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        for error in [Some(cause), inner.map(|e| e as &(dyn std::error::Error + 'static))] {
            if let Some(rustls::Error::InvalidCertificate(_)) =
                error.and_then(|e| e.downcast_ref::<rustls::Error>())
            {
                return true;
            }
        }
        source = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_parameters_are_taken_out_and_the_rest_kept() {
        let (url, tls) = Tls::split("postgres://u:p%40ss@db/flows").unwrap();
        assert_eq!((url.as_str(), tls.mode), ("postgres://u:p%40ss@db/flows", Mode::Prefer));
        let (url, tls) = Tls::split(
            "postgres://db/flows?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(url, "postgres://db/flows?application_name=x&sslmode=require");
        assert_eq!(tls.mode, Mode::VerifyFull);
        assert_eq!(tls.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let (url, tls) = Tls::split("postgres://db/f?sslmode=disable&sslrootcert=system").unwrap();
        assert!(tls.client_cert.is_none());
        assert_eq!(
            (url.as_str(), tls.mode, tls.root_cert),
            ("postgres://db/f?sslmode=disable", Mode::Disable, None)
        );
        let (_, tls) = Tls::split("postgres://db/f?sslcert=/c.pem&sslkey=/k.pem").unwrap();
        assert_eq!(tls.client_key, Some(PathBuf::from("/k.pem")));
        let e = Tls::split("postgres://db/f?sslcert=/c.pem").unwrap_err();
        assert!(e.contains("both sslcert and sslkey"), "{e}");
        let e = Tls::split("postgres://db/f?sslmode=always").unwrap_err();
        assert!(e.contains("sslmode `always`"), "{e}");
    }
}
