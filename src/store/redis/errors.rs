//! Maps `redis` crate errors onto [`StoreError`].
//!
//! Owns the one table that decides whether a failure is transient (`Unavailable`: retry later,
//! answer `STORE_UNAVAILABLE`), a server that cannot run this layout (`Unsupported`: fail fast,
//! naming the command), or something the contract does not allow (`Protocol`).
//! Invariant: no error text produced here contains the connection password ([`Redactor`]).

use ::redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::StoreError;

/// Removes the connection password from any text before it leaves the store. The `redis` crate
/// does not put credentials into its error messages today; this makes that a guarantee.
#[derive(Clone, Debug, Default)]
pub(crate) struct Redactor {
    password: Option<String>,
}

impl Redactor {
    pub(crate) fn new(password: Option<&str>) -> Self {
        Self { password: password.filter(|p| !p.is_empty()).map(str::to_string) }
    }

    pub(crate) fn clean(&self, text: String) -> String {
        match &self.password {
            Some(password) if text.contains(password.as_str()) => text.replace(password.as_str(), "***"),
            _ => text,
        }
    }
}

/// The error for a round trip that did not finish within the store's timeout.
pub(crate) fn timed_out(command: &str, timeout_ms: u64) -> StoreError {
    StoreError::Unavailable(format!("{command}: no reply within {timeout_ms} ms"))
}

/// Maps one failed command. `command` is the command (or script) the caller sent; it names the
/// failure when the server's text does not.
pub(crate) fn map_error(command: &str, err: &RedisError, redactor: &Redactor) -> StoreError {
    let code = err.code().unwrap_or("");
    let detail = err.detail().unwrap_or("");
    // Server errors read as on the wire (`NOGROUP No such key ...`), so callers and the contract
    // suite can match the code; the command is appended for context.
    let text = match err.code() {
        Some(code) if !detail.is_empty() => redactor.clean(format!("{code} {detail} ({command})")),
        _ => redactor.clean(format!("{command}: {err}")),
    };
    // A key of this layout holds another Redis type (an out-of-band write): not in this layout,
    // so a metadata call fails closed as METADATA_INCOMPATIBLE, not as a retryable outage. A
    // pipeline reports it inside its own error (`Pipeline failure: [(Index 1, error: "WRONGTYPE"
    // ...)]`), so the text is matched as well as the code.
    if code == "WRONGTYPE" || err.to_string().contains("\"WRONGTYPE\"") {
        return StoreError::Layout(text);
    }
    match err.kind() {
        ErrorKind::Io => StoreError::Unavailable(text),
        ErrorKind::AuthenticationFailed => {
            StoreError::Unavailable(format!("{command}: authentication failed (check the store credentials)"))
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown,
        ) => StoreError::Unavailable(text),
        // The script cache was flushed between the load and the call (SCRIPT FLUSH, failover to a
        // replica that never saw SCRIPT LOAD twice in a row). A retry reloads it.
        ErrorKind::Server(ServerErrorKind::NoScript) => StoreError::Unavailable(text),
        // A Cluster redirect the client did not follow to the end (a pipeline whose keys a slot
        // move has split: each command runs where its key is, and the rest is answered ASK or
        // MOVED): the call did not complete, and will once the move does.
        ErrorKind::Server(ServerErrorKind::Ask | ServerErrorKind::Moved) => StoreError::Unavailable(text),
        ErrorKind::Server(ServerErrorKind::NoPerm) => StoreError::Unsupported {
            command: quoted_command(detail).unwrap_or_else(|| command.to_uppercase()),
            detail: redactor.clean(format!("{code} {detail}")),
        },
        // A script touched a key its slot's move has already taken from this node (a fence's gate
        // moved before its fence key: scripts name gates from the key, undeclared). Redis refuses
        // that command before it runs, and the fence scripts write nothing before it: like an
        // `ASK`, the call did nothing and will succeed once the move ends.
        ErrorKind::Server(ServerErrorKind::ResponseError) if is_non_local_key_text(detail) => {
            StoreError::Unavailable(text)
        }
        ErrorKind::Server(ServerErrorKind::ResponseError) if is_unsupported_text(detail) => StoreError::Unsupported {
            command: quoted_command(detail).unwrap_or_else(|| command.to_uppercase()),
            detail: redactor.clean(format!("{code} {detail}")),
        },
        // Codes the crate does not know by name.
        ErrorKind::Extension => match code {
            "WRONGPASS" | "NOAUTH" => {
                StoreError::Unavailable(format!("{command}: authentication failed (check the store credentials)"))
            }
            // A long-running script (BUSY), or a blocked read the server force-unblocked because its
            // role changed during a failover (UNBLOCKED).
            "BUSY" | "UNBLOCKED" => StoreError::Unavailable(text),
            // A master with `min-replicas-to-write` that lost its replicas refuses writes until
            // they are back (or, through Sentinel, until the store finds the new master): the call
            // did nothing, as with READONLY.
            "NOREPLICAS" => StoreError::Unavailable(text),
            // A server at `maxmemory` with `noeviction` refuses every command that may grow
            // memory (the liveness touch, the mutex, metadata writes), and one whose last RDB
            // save failed refuses writes (`MISCONF`): the call did nothing and works once memory
            // or the disk is freed. Both were `Protocol` ("unexpected store reply": a bug), which
            // hid an operational state behind a wrong answer.
            "OOM" | "MISCONF" => StoreError::Unavailable(text),
            _ => StoreError::Protocol(text),
        },
        // `ERR max number of clients reached`: the server refused this connection's command at
        // its `maxclients`; transient like a refused connection.
        ErrorKind::Server(ServerErrorKind::ResponseError)
            if detail.to_ascii_lowercase().starts_with("max number of clients reached") =>
        {
            StoreError::Unavailable(text)
        }
        _ => StoreError::Protocol(text),
    }
}

/// A script's command refused because its key is not on this node (Redis 7: "Script attempted to
/// access a non local key in a cluster node script"; 6.2: "Lua script attempted to access a non
/// local key in a cluster node").
fn is_non_local_key_text(detail: &str) -> bool {
    detail.to_ascii_lowercase().contains("non local key")
}

/// Server texts meaning "this server will not run that command": renamed or missing commands,
/// and ACL denials reported from inside a script (where the code is plain `ERR`).
fn is_unsupported_text(detail: &str) -> bool {
    let lower = detail.to_ascii_lowercase();
    lower.starts_with("unknown command")
        || lower.starts_with("unknown redis command called from script")
        || lower.contains("can't run this command")
        || lower.contains("no permissions to run")
}

/// The command name a server message quotes (`unknown command 'xautoclaim'`, `no permissions to run
/// the 'hset' command`), upper-cased.
fn quoted_command(detail: &str) -> Option<String> {
    let start = detail.find('\'')? + 1;
    let len = detail[start..].find('\'')?;
    let name = &detail[start..start + len];
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '|' || c == '-'))
        .then(|| name.to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &'static str, detail: &'static str) -> RedisError {
        // The crate parses server errors from RESP; build one the same way.
        let bytes = format!("-{code} {detail}\r\n");
        match ::redis::parse_redis_value(bytes.as_bytes()) {
            Ok(::redis::Value::ServerError(err)) => err.into(),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn renamed_and_denied_commands_are_unsupported_and_named() {
        let redactor = Redactor::default();
        let unknown = server_error("ERR", "unknown command 'xautoclaim', with args beginning with: 's'");
        assert!(matches!(
            map_error("XAUTOCLAIM", &unknown, &redactor),
            StoreError::Unsupported { command, .. } if command == "XAUTOCLAIM"
        ));
        let denied = server_error("NOPERM", "this user has no permissions to run the 'hset' command");
        assert!(matches!(
            map_error("EVALSHA", &denied, &redactor),
            StoreError::Unsupported { command, .. } if command == "HSET"
        ));
        let in_script = server_error("ERR", "The user executing the script can't run this command or subcommand");
        assert!(matches!(
            map_error("write script", &in_script, &redactor),
            StoreError::Unsupported { command, .. } if command == "WRITE SCRIPT"
        ));
    }

    #[test]
    fn transient_server_states_are_unavailable_and_the_rest_protocol() {
        let redactor = Redactor::default();
        for (code, detail) in [
            ("LOADING", "Redis is loading the dataset in memory"),
            ("READONLY", "You can't write against a read only replica."),
            ("MASTERDOWN", "Link with MASTER is down"),
            ("UNBLOCKED", "force unblock from blocking operation"),
            ("NOREPLICAS", "Not enough good replicas to write."),
            ("OOM", "command not allowed when used memory > 'maxmemory'."),
            ("MISCONF", "Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."),
            ("ERR", "max number of clients reached"),
        ] {
            assert!(matches!(map_error("X", &server_error(code, detail), &redactor), StoreError::Unavailable(_)));
        }
        let nogroup = server_error("NOGROUP", "No such key 's' or consumer group 'g'");
        assert!(matches!(map_error("XREADGROUP", &nogroup, &redactor), StoreError::Protocol(_)));
    }

    #[test]
    fn the_password_never_appears_in_error_text() {
        let redactor = Redactor::new(Some("hunter2"));
        let err = server_error("ERR", "something about hunter2");
        let text = map_error("GET", &err, &redactor).to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("***"), "{text}");
    }
}
