//! `checkout migrate`: applies the store's schema migrations and exits, for a deploy step (a
//! Job or an init container) that runs before the replicas start. `serve` applies them at start
//! as well, so running this first is a choice, not a requirement.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use checkout::config::{Config, redact_url};

/// Flags of `checkout migrate`; each overrides the config file.
///
/// On PostgreSQL the migrations run in one transaction under a transaction-level advisory
/// lock (`pg_advisory_xact_lock`, released at its commit, so it holds through a transaction
/// pooler too), so migrators and replicas starting together are serialized: each applies what
/// the one before it left out.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// TOML config (as for `serve`): its `[store]` section is used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// PostgreSQL (postgres://user@host:port/db): the database `serve --database-url` uses.
    /// Keep the password out of it: PGPASSWORD or PGPASSFILE (or ~/.pgpass) supply it. Never
    /// shown by --help, errors or logs.
    #[arg(long, env = "CHECKOUT_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Directory of the embedded SQLite store; given, it is used even if a database URL is
    /// (from the environment, say). SQLite serves one replica: run this while no `serve` uses
    /// the directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl MigrateArgs {
    /// The config file with the flags applied, validated.
    fn config(&self) -> anyhow::Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(url) = &self.database_url {
            config.store.database_url = Some(url.clone());
        }
        if let Some(dir) = &self.data_dir {
            config.store.data_dir = dir.clone();
            config.store.database_url = None;
        }
        config.store.in_memory = false;
        config.validate()?;
        Ok(config)
    }
}

/// Opens the store (which applies every migration not yet applied) and closes it.
pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    let store = &config.store;
    let target = match &store.database_url {
        Some(url) => format!("PostgreSQL {}", redact_url(url)),
        None => format!("SQLite {}", store.data_dir.join("checkout.db").display()),
    };
    let opened = checkout::store::open(store)
        .await
        .with_context(|| format!("migrating {target}"))?;
    opened.close().await;
    println!("checkout migrate: the schema of {target} is up to date");
    Ok(())
}
