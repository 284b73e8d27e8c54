//! The connection to one Redis Cluster node that the `redis` crate's cluster client uses
//! ([`NodeConn`]): its multiplexed connection, except that `ASKING` travels in one write with the
//! command it is for.
//!
//! Owns: the `ASKING` of an `ASK` redirect the cluster client follows.
//! Never: sends `ASKING` on its own. The flag it sets at the server lasts for the next command on
//! that connection, whichever caller sent it.
//! Invariant: the held `ASKING` belongs to one handle (a clone of the connection), and the cluster
//! client sends the redirected command on the very handle it sent `ASKING` on
//! (`get_redirected_connection`, then the request on the connection it returned), so the flag
//! reaches the server in the same write as that command.
//!
//! Why: the cluster client follows an `ASK` by sending `ASKING` and the command as two requests
//! on its shared connection to the node the `ASK` names. Any other command on that connection in
//! between (a call to any other slot of that node, not only another redirect) takes the one-time
//! flag; the command is then answered `MOVED`, the source answers `ASK` again, and every `MOVED`
//! starts a slot-map refresh. Under load a slot move became hundreds of refreshes, and a refresh
//! could hang the whole connection until every caller's deadline (valkey-glide#2643): in
//! `store_contract`'s `calls_to_other_slots_during_a_move_all_succeed` (16 calls to the moving
//! slot among 512 to the other slots, five rounds) 115 of 2,640 calls failed so before this
//! connection type. redis-plus-plus#281 describes the same race.
//!
//! The cluster client takes its node connection type as a parameter
//! (`ClusterClient::get_async_generic_connection`, public but hidden from the crate's docs); the
//! crate is pinned by `Cargo.lock`, and the contract cases above fail if a new version stops
//! sending the redirected command on the handle it sent `ASKING` on.

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster_async::Connect;
use ::redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult, Value,
};

/// A cluster node's connection whose `ASKING` waits for the command it is for (module docs).
#[derive(Clone)]
pub(crate) struct NodeConn {
    inner: MultiplexedConnection,
    /// An `ASKING` this handle was asked to send, not yet sent.
    asking: bool,
}

impl Connect for NodeConn {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        Box::pin(async move {
            let inner = MultiplexedConnection::connect_with_config(info, config).await?;
            Ok(Self { inner, asking: false })
        })
    }
}

/// Whether `cmd` is `ASKING` (nothing else).
fn is_asking(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter();
    matches!(
        (args.next(), args.next()),
        (Some(::redis::Arg::Simple(name)), None) if name.eq_ignore_ascii_case(b"ASKING")
    )
}

fn asking() -> Cmd {
    ::redis::cmd("ASKING")
}

/// The replies after `ASKING`'s and the `skip` next: `ASKING`'s own error (`NOPERM` for a user
/// without `+asking`) is the call's error, as when the crate sent `ASKING` on its own.
fn after_asking(mut replies: Vec<Value>, skip: usize) -> RedisResult<Vec<Value>> {
    if replies.is_empty() {
        return Err(RedisError::from((ErrorKind::Client, "no reply to ASKING")));
    }
    replies.remove(0).extract_error()?;
    Ok(replies.into_iter().skip(skip).collect())
}

impl ConnectionLike for NodeConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if is_asking(cmd) {
            // Held for the next command on this handle; `ASKING` itself always answers OK.
            self.asking = true;
            return Box::pin(async { Ok(Value::Okay) });
        }
        if !std::mem::take(&mut self.asking) {
            return self.inner.req_packed_command(cmd);
        }
        Box::pin(async move {
            let mut pipeline = Pipeline::new();
            pipeline.add_command(asking()).add_command(cmd.clone());
            let replies = self.inner.req_packed_commands(&pipeline, 0, 2).await?;
            // The command's reply (an error reply stays a value, as on the plain path).
            Ok(after_asking(replies, 0)?.pop().unwrap_or(Value::Nil))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if !std::mem::take(&mut self.asking) {
            return self.inner.req_packed_commands(pipeline, offset, count);
        }
        Box::pin(async move {
            if pipeline.is_transaction() {
                // `ASKING` cannot go inside MULTI: sent first, as the crate would, so the race
                // remains for transactions (this store sends none); its refusal is the error.
                self.inner.req_packed_command(&asking()).await?.extract_error()?;
                return self.inner.req_packed_commands(pipeline, offset, count).await;
            }
            let mut with_asking = Pipeline::new();
            with_asking.add_command(asking());
            for cmd in pipeline.cmd_iter() {
                with_asking.add_command(cmd.clone());
            }
            let replies = self.inner.req_packed_commands(&with_asking, 0, 1 + offset + count).await?;
            after_asking(replies, offset)
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bare_asking_is_held() {
        assert!(is_asking(&::redis::cmd("ASKING")));
        assert!(is_asking(&::redis::cmd("asking")));
        assert!(!is_asking(::redis::cmd("ASKING").arg("x")));
        assert!(!is_asking(::redis::cmd("GET").arg("ASKING")));
        assert!(!is_asking(&::redis::cmd("PING")));
    }

    fn server_error(line: &str) -> Value {
        ::redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).expect("an error reply")
    }

    #[test]
    fn the_replies_after_asking_are_the_commands_and_an_asking_refusal_is_the_calls_error() {
        let ok = || Value::Okay;
        let nil = || Value::Nil;
        assert_eq!(after_asking(vec![ok(), Value::Int(1), nil()], 0), Ok(vec![Value::Int(1), nil()]));
        assert_eq!(after_asking(vec![ok(), Value::Int(1), nil()], 1), Ok(vec![nil()]));
        // The command's own error reply stays a value, as without ASKING.
        let wrongtype = server_error("WRONGTYPE Operation against a key holding the wrong kind of value");
        assert_eq!(after_asking(vec![ok(), wrongtype.clone()], 0), Ok(vec![wrongtype]));
        let refused = after_asking(vec![server_error("NOPERM no permissions to run the 'asking' command"), nil()], 0)
            .expect_err("ASKING refused");
        assert_eq!(refused.kind(), ErrorKind::Server(::redis::ServerErrorKind::NoPerm));
        assert!(after_asking(Vec::new(), 0).is_err());
    }
}
