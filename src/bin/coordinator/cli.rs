//! Command-line arguments of `coordinator` (clap derive). Owns parsing only: what `serve` runs
//! with is resolved in `config.rs` (flags and environment over the TOML file over defaults), what
//! the admin commands send is built in `admin.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Coordinator for sharded Redis Streams: exclusive shard ownership for consumer groups.
#[derive(Debug, Parser)]
#[command(name = "coordinator", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at startup and moved out at once: the size of `Serve` costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the coordinator HTTP API until SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Operate a running coordinator over HTTP.
    Admin(AdminArgs),
}

/// `coordinator serve`. Every flag overrides the same key of `--config`.
#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:7420].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Redis URL (redis://[user:password@]host:port[/db], or rediss://... for TLS). Without one
    /// the coordinator serves from an in-memory store: nothing is durable.
    #[arg(long, env = "REDIS_URL", hide_env_values = true, value_name = "URL")]
    pub redis_url: Option<String>,
    /// PEM file of the CA certificate(s) that signed the Redis server's (or every Cluster node's)
    /// TLS certificate (rediss:// only) [default: the platform's root certificates].
    #[arg(long, env = "REDIS_TLS_CA_FILE", value_name = "FILE")]
    pub redis_tls_ca_file: Option<PathBuf>,
    /// PEM file of the client certificate for mutual TLS (rediss:// only; needs
    /// --redis-tls-client-key-file).
    #[arg(long, env = "REDIS_TLS_CLIENT_CERT_FILE", value_name = "FILE")]
    pub redis_tls_client_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key for mutual TLS (rediss:// only).
    #[arg(long, env = "REDIS_TLS_CLIENT_KEY_FILE", value_name = "FILE")]
    pub redis_tls_client_key_file: Option<PathBuf>,
    /// Find the Redis master through these Sentinels (host:port,host:port,...) instead of a fixed
    /// server; needs --redis-sentinel-master. REDIS_URL is then optional and may only name the
    /// master (redis://[user:password@]<master name>[/db]) to carry its credentials and database.
    #[arg(long, env = "REDIS_SENTINELS", value_name = "HOST:PORT,...")]
    pub redis_sentinels: Option<String>,
    /// Run on a Redis Cluster found from these seed nodes (redis://[user:password@]host:port,...,
    /// or all rediss:// for TLS with the Redis TLS files; any subset of the cluster's nodes, all
    /// with the same credentials) instead of REDIS_URL. Not combinable with REDIS_URL or Sentinel.
    #[arg(long, env = "REDIS_CLUSTER_NODES", hide_env_values = true, value_name = "URL,...")]
    pub redis_cluster_nodes: Option<String>,
    /// The master name the Sentinels monitor (`sentinel monitor <name> ...`).
    #[arg(long, env = "REDIS_SENTINEL_MASTER", value_name = "NAME")]
    pub redis_sentinel_master: Option<String>,
    /// Password of the Sentinels themselves (their requirepass), if they require one.
    #[arg(long, env = "REDIS_SENTINEL_PASSWORD", hide_env_values = true, value_name = "PASSWORD")]
    pub redis_sentinel_password: Option<String>,
    /// TOML file with serve settings (keys as in the flags, snake_case; see config.rs).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Bearer token required by admin routes. Without one, admin routes are open.
    #[arg(long, env = "COORDINATOR_ADMIN_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub admin_token: Option<String>,
    /// A client token the data plane (heartbeat, routing) accepts; repeat for several (rotation).
    /// `TOKEN` admits every group, `PREFIX:GROUP=TOKEN` one scope (`*` for any part; split at the
    /// last `:`, so a prefix may contain `:`). Without any,
    /// the data plane is open and accepts loss evidence from any client.
    #[arg(
        long = "client-token",
        env = "COORDINATOR_CLIENT_TOKENS",
        value_delimiter = ',',
        hide_env_values = true,
        value_name = "[SCOPE=]TOKEN"
    )]
    pub client_tokens: Vec<String>,
    /// Names this instance in Redis mutex tokens and logs [default: $HOSTNAME or coordinator-<pid>].
    #[arg(long, value_name = "ID")]
    pub instance_id: Option<String>,
    /// Period of the event-loop tick (expiry, fencing, releases) [default: 250].
    #[arg(long, value_name = "MS")]
    pub tick_interval_ms: Option<u64>,
    /// The longest assignment lease a group may configure; set it to the same value on every
    /// instance. Correction rounds (after a failover lost writes) wait at least this long: a lease
    /// increase the failover lost is bounded by nothing else [default: 8000, the default group
    /// lease; at most 86400000].
    #[arg(long, env = "RSC_MAX_ASSIGNMENT_LEASE_MS", value_name = "MS")]
    pub max_assignment_lease_ms: Option<u64>,
    /// Largest request body accepted [default: 1048576].
    #[arg(long, value_name = "BYTES")]
    pub body_bytes_max: Option<usize>,
    /// On SIGTERM, how long to wait for entered critical sections, then for open connections
    /// [default: 10000].
    #[arg(long, value_name = "MS")]
    pub shutdown_timeout_ms: Option<u64>,

    // --- Listener: shutdown accept window, /metrics exposure, TLS (issue 9 parts 3, 4, 7) ---
    /// On SIGTERM, how long to keep accepting new connections (answering as a terminating
    /// instance: 503 COORDINATOR_TERMINATING for mutations, routing served, /readyz 503) before
    /// closing the listener, so load balancers and Kubernetes endpoints can stop sending traffic
    /// first [default: 5000; at most 300000].
    #[arg(long, env = "COORDINATOR_SHUTDOWN_ACCEPT_MS", value_name = "MS")]
    pub shutdown_accept_ms: Option<u64>,
    /// Export per-member series (`rsc_member_*{group,member}`) on /metrics. Off by default: they
    /// name every member id (which /metrics serves without authentication) and grow with the
    /// member count; per-group aggregates are always exported.
    #[arg(long, env = "COORDINATOR_METRICS_MEMBER_LABELS", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub metrics_member_labels: Option<bool>,
    /// PEM file of the certificate chain the HTTP listener presents (TLS: serve https://; needs
    /// --tls-key-file).
    #[arg(long, env = "COORDINATOR_TLS_CERT_FILE", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file of the listener certificate's private key (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "COORDINATOR_TLS_KEY_FILE", value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM file of the CA certificate(s) client certificates must chain to (mutual TLS: a client
    /// without such a certificate cannot connect). Needs --tls-cert-file.
    #[arg(long, env = "COORDINATOR_TLS_CLIENT_CA_FILE", value_name = "FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    // --- end of listener settings ---
}

/// `coordinator admin`.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Base URL of a running coordinator.
    #[arg(long, env = "COORDINATOR_URL", default_value = "http://127.0.0.1:7420", global = true)]
    pub url: String,
    /// Admin bearer token.
    #[arg(long, env = "COORDINATOR_ADMIN_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Request timeout.
    #[arg(long, default_value_t = 10_000, value_name = "MS", global = true)]
    pub timeout_ms: u64,
    // --- TLS to the coordinator's listener (issue 9 part 3) ---
    /// PEM file of the CA that signed the coordinator's certificate (needed for an https:// --url).
    #[arg(long, env = "COORDINATOR_TLS_CA_FILE", value_name = "FILE", global = true)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM file of this client's certificate, for a coordinator that requires mutual TLS (needs
    /// --tls-client-key-file).
    #[arg(long, env = "COORDINATOR_TLS_CLIENT_CERT_FILE", value_name = "FILE", global = true)]
    pub tls_client_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(long, env = "COORDINATOR_TLS_CLIENT_KEY_FILE", value_name = "FILE", global = true)]
    pub tls_client_key_file: Option<PathBuf>,
    // --- end of TLS ---
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// A group on the command line.
#[derive(Debug, Clone, Args)]
pub struct GroupArgs {
    /// Stream prefix (shard streams are <prefix>:<shard>).
    #[arg(long)]
    pub prefix: String,
    /// Consumer group name.
    #[arg(long)]
    pub group: String,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create a group.
    CreateGroup {
        #[command(flatten)]
        group: GroupArgs,
        /// Number of shards.
        #[arg(long)]
        shards: u32,
        /// Group config as JSON; keys not given keep their defaults
        /// (e.g. '{"assignmentLeaseMs":5000,"memberLeaseTtlMs":6000}').
        #[arg(long, value_name = "JSON")]
        config_json: Option<String>,
    },
    /// Raise the shard count (shards are only ever added).
    AddShards {
        #[command(flatten)]
        group: GroupArgs,
        /// The storeRevision the change is based on (from `describe`).
        #[arg(long)]
        expected_revision: u64,
        /// The new total shard count.
        #[arg(long)]
        shards: u32,
    },
    /// Change the group config; keys not given keep their current values.
    SetConfig {
        #[command(flatten)]
        group: GroupArgs,
        /// The storeRevision the change is based on (from `describe`).
        #[arg(long)]
        expected_revision: u64,
        /// Config keys to change, as JSON.
        #[arg(long, value_name = "JSON")]
        config_json: String,
    },
    /// Print a group's recorded metadata, storeRevision and liveness counters.
    Describe {
        #[command(flatten)]
        group: GroupArgs,
    },
    /// Rebuild the group index from a SCAN of metadata keys.
    RebuildIndex,
    /// Delete a group (its metadata, liveness and index entry; never its streams). Refused with
    /// GROUP_NOT_EMPTY while it has members or shards whose leases still run.
    Delete {
        #[command(flatten)]
        group: GroupArgs,
        /// The storeRevision the delete is based on (from `describe`).
        #[arg(long)]
        expected_revision: u64,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// `--help` prints the current value of each setting's environment variable unless it is
    /// hidden: every variable that can carry a secret (a password in a Redis URL, a token) hides
    /// it. `REDIS_CLUSTER_NODES` (seed URLs with the password) did not.
    #[test]
    fn help_never_shows_the_value_of_a_variable_that_can_carry_a_secret() {
        let secret_bearing = [
            "REDIS_URL",
            "REDIS_CLUSTER_NODES",
            "REDIS_SENTINEL_PASSWORD",
            "COORDINATOR_ADMIN_TOKEN",
            "COORDINATOR_CLIENT_TOKENS",
        ];
        let command = Cli::command();
        let mut found = Vec::new();
        for sub in command.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(env) = arg.get_env().and_then(|e| e.to_str()) else { continue };
                if secret_bearing.contains(&env) {
                    assert!(arg.is_hide_env_values_set(), "{env}'s value is shown by --help");
                    found.push(env.to_string());
                }
            }
        }
        found.sort();
        found.dedup();
        assert_eq!(found.len(), secret_bearing.len(), "every such variable is a serve setting: {found:?}");
    }

    #[test]
    fn admin_commands_parse() {
        let cli = Cli::try_parse_from([
            "coordinator",
            "admin",
            "add-shards",
            "--prefix",
            "orders",
            "--group",
            "billing",
            "--expected-revision",
            "3",
            "--shards",
            "8",
            "--url",
            "http://10.0.0.1:7420",
        ])
        .expect("parses");
        let Command::Admin(admin) = cli.command else { panic!("admin") };
        assert_eq!(admin.url, "http://10.0.0.1:7420");
        assert!(matches!(admin.command, AdminCommand::AddShards { expected_revision: 3, shards: 8, .. }));
    }

    #[test]
    fn tls_flags_parse_and_each_has_its_environment_variable() {
        let cli = Cli::try_parse_from([
            "coordinator",
            "serve",
            "--redis-tls-ca-file",
            "/etc/rsc/ca.pem",
            "--redis-tls-client-cert-file",
            "/etc/rsc/client.pem",
            "--redis-tls-client-key-file",
            "/etc/rsc/client.key",
        ])
        .expect("parses");
        let Command::Serve(serve) = cli.command else { panic!("serve") };
        assert_eq!(serve.redis_tls_ca_file, Some(PathBuf::from("/etc/rsc/ca.pem")));
        assert_eq!(serve.redis_tls_client_cert_file, Some(PathBuf::from("/etc/rsc/client.pem")));
        assert_eq!(serve.redis_tls_client_key_file, Some(PathBuf::from("/etc/rsc/client.key")));

        let command = Cli::command();
        let serve = command.find_subcommand("serve").expect("serve subcommand");
        for (flag, env) in [
            ("redis_tls_ca_file", "REDIS_TLS_CA_FILE"),
            ("redis_tls_client_cert_file", "REDIS_TLS_CLIENT_CERT_FILE"),
            ("redis_tls_client_key_file", "REDIS_TLS_CLIENT_KEY_FILE"),
            ("redis_sentinels", "REDIS_SENTINELS"),
            ("redis_sentinel_master", "REDIS_SENTINEL_MASTER"),
            ("redis_sentinel_password", "REDIS_SENTINEL_PASSWORD"),
            ("redis_cluster_nodes", "REDIS_CLUSTER_NODES"),
        ] {
            let arg = serve.get_arguments().find(|a| a.get_id() == flag).expect("the flag exists");
            assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(env), "{flag}");
        }
    }

    // --- Listener flags (issue 9: accept window, /metrics exposure, TLS) ---

    #[test]
    fn listener_flags_parse_and_each_has_its_environment_variable() {
        let cli = Cli::try_parse_from([
            "coordinator",
            "serve",
            "--shutdown-accept-ms",
            "2500",
            "--metrics-member-labels",
            "--tls-cert-file",
            "/etc/rsc/coordinator.pem",
            "--tls-key-file",
            "/etc/rsc/coordinator.key",
            "--tls-client-ca-file",
            "/etc/rsc/clients-ca.pem",
        ])
        .expect("parses");
        let Command::Serve(serve) = cli.command else { panic!("serve") };
        assert_eq!(serve.shutdown_accept_ms, Some(2_500));
        assert_eq!(serve.metrics_member_labels, Some(true), "the bare flag turns it on");
        assert_eq!(serve.tls_cert_file, Some(PathBuf::from("/etc/rsc/coordinator.pem")));
        assert_eq!(serve.tls_key_file, Some(PathBuf::from("/etc/rsc/coordinator.key")));
        assert_eq!(serve.tls_client_ca_file, Some(PathBuf::from("/etc/rsc/clients-ca.pem")));
        let off = Cli::try_parse_from(["coordinator", "serve", "--metrics-member-labels", "false"]).expect("parses");
        let Command::Serve(off) = off.command else { panic!("serve") };
        assert_eq!(off.metrics_member_labels, Some(false));

        let command = Cli::command();
        let serve = command.find_subcommand("serve").expect("serve subcommand");
        for (flag, env) in [
            ("shutdown_accept_ms", "COORDINATOR_SHUTDOWN_ACCEPT_MS"),
            ("metrics_member_labels", "COORDINATOR_METRICS_MEMBER_LABELS"),
            ("tls_cert_file", "COORDINATOR_TLS_CERT_FILE"),
            ("tls_key_file", "COORDINATOR_TLS_KEY_FILE"),
            ("tls_client_ca_file", "COORDINATOR_TLS_CLIENT_CA_FILE"),
        ] {
            let arg = serve.get_arguments().find(|a| a.get_id() == flag).expect("the flag exists");
            assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(env), "{flag}");
        }
    }
}
