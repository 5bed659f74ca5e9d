//! `nbos pki init|issue`: a cluster's own CA and its certificates ([`notebookosd::pki`]).

use std::net::IpAddr;
use std::path::PathBuf;

use notebookosd::pki::Pki;

/// `nbos pki …`.
#[derive(Debug, clap::Subcommand)]
pub enum PkiCmd {
    /// Create a CA in DIR: ca.pem (give it to every host and client) and ca.key (0600,
    /// kept to issue certificates; keep it off the hosts).
    Init {
        /// The PKI directory (created 0700).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Issue a certificate signed by the CA in DIR.
    Issue {
        /// The PKI directory.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        #[command(subcommand)]
        what: IssueCmd,
    },
}

/// What `nbos pki issue` issues.
#[derive(Debug, clap::Subcommand)]
pub enum IssueCmd {
    /// A host's certificate (node-<ID>.pem/.key): raft transport, HTTPS listener, and the
    /// host's identity on calls to other hosts.
    Node {
        /// The host's cluster.node_id.
        id: u64,
        /// A DNS name clients use for this host's HTTPS listener (repeatable).
        #[arg(long = "dns", value_name = "NAME")]
        dns: Vec<String>,
        /// An IP address clients use for this host's HTTPS listener (repeatable).
        #[arg(long = "ip", value_name = "ADDR")]
        ips: Vec<IpAddr>,
    },
    /// A client's certificate (client-<NAME>.pem/.key), e.g. for jupyter_server's
    /// GatewayClient.client_cert/client_key.
    Client {
        /// The client's name ([A-Za-z0-9_.-], up to 64).
        name: String,
    },
}

/// Runs a `nbos pki` subcommand.
pub fn run(cmd: PkiCmd) -> anyhow::Result<()> {
    match cmd {
        PkiCmd::Init { dir } => {
            let pki = Pki::at(&dir);
            pki.init()?;
            println!("CA certificate {}", pki.ca_cert().display());
            println!("CA key         {} (keep it private; needed to issue more)", pki.ca_key().display());
        }
        PkiCmd::Issue { dir, what } => {
            let pki = Pki::at(&dir);
            let issued = match what {
                IssueCmd::Node { id, dns, ips } => pki.issue_node(id, &dns, &ips)?,
                IssueCmd::Client { name } => pki.issue_client(&name)?,
            };
            println!("certificate {}", issued.cert.display());
            println!("key         {}", issued.key.display());
        }
    }
    Ok(())
}
