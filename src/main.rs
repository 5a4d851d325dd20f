//! The `substrate-gate` command line.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use substrate_gate::{audit, checkpoint, server, store::Store};
use uuid::Uuid;

/// mimalloc: the proxy's write path allocates many small, short-lived JSON values across
/// threads; glibc malloc spent about a sixth of the gate's CPU on them (perf, benches/proxy.sh).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "substrate-gate",
    version,
    about = "Integrity sidecar for agent memory, RAG and policy stores"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the api, proxy and metrics listeners.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate a config and its filter packs; print every problem with its path.
    CheckConfig { file: PathBuf },
    /// Apply storage migrations and exit.
    Migrate {
        #[arg(long)]
        config: PathBuf,
    },
    /// Receipt chain audit.
    Receipts {
        #[command(subcommand)]
        command: ReceiptsCommand,
    },
}

#[derive(Subcommand)]
enum ReceiptsCommand {
    /// Walk receipt chains (from the store, or an export file) and report the first broken link.
    Verify {
        #[arg(long, required_unless_present = "file")]
        config: Option<PathBuf>,
        #[arg(long)]
        tenant: Option<Uuid>,
        /// Verify a JSON Lines export offline instead of the store.
        #[arg(long, conflicts_with = "config")]
        file: Option<PathBuf>,
        /// A signed checkpoint kept elsewhere: its tenant's chain in the store must extend it
        /// (hold its hash at its sequence and verify through it to the head).
        #[arg(long, requires = "config", conflicts_with = "file")]
        checkpoint: Option<PathBuf>,
        /// The verifier key (`NAME+KEYID+KEY`) the checkpoint must be signed with; by default
        /// the public half of the config's `checkpoints.key_file`.
        #[arg(long, requires = "checkpoint")]
        vkey: Option<String>,
    },
    /// Sign a tenant's chain head now (with `checkpoints.key_file`) and print the checkpoint.
    Checkpoint {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        tenant: Uuid,
    },
    /// Export a tenant's receipts with their chain links as JSON Lines.
    Export {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        tenant: Uuid,
        /// Only receipts created at or after this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        /// Output file (standard output when absent).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("gate")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::CheckConfig { file } => match server::load_or_report(&file) {
            Ok(l) => {
                println!(
                    "{}: ok ({} tenants, {} policies, {} filter packs)",
                    file.display(),
                    l.config.tenants.len(),
                    l.config.policies.len(),
                    l.packs.len()
                );
                ExitCode::SUCCESS
            }
            Err(problems) => {
                for p in &problems {
                    println!("{p}");
                }
                eprintln!("{}: {} problem(s)", file.display(), problems.len());
                ExitCode::FAILURE
            }
        },
        Command::Serve { config } => match rt.block_on(server::serve(&config)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Migrate { config } => rt.block_on(async {
            match open_store(&config).await {
                Ok(_) => {
                    println!("migrations applied");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }),
        Command::Receipts { command } => rt.block_on(receipts(command)),
    }
}

async fn open_store(config: &std::path::Path) -> Result<Store, String> {
    let loaded =
        server::load_or_report(config).map_err(|p| format!("invalid config:\n{}", p.join("\n")))?;
    Store::connect(&loaded.config.storage)
        .await
        .map_err(|e| e.to_string())
}

async fn receipts(command: ReceiptsCommand) -> ExitCode {
    match command {
        ReceiptsCommand::Verify {
            file: Some(file),
            tenant,
            ..
        } => {
            let reader = match std::fs::File::open(&file) {
                Ok(f) => std::io::BufReader::new(f),
                Err(e) => {
                    eprintln!("cannot open {}: {e}", file.display());
                    return ExitCode::FAILURE;
                }
            };
            match audit::verify_file(reader) {
                Ok(reports) => report(
                    reports
                        .into_iter()
                        .filter(|r| tenant.is_none_or(|t| r.tenant == t.to_string()))
                        .collect(),
                ),
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        ReceiptsCommand::Verify {
            config: Some(config),
            checkpoint: Some(file),
            vkey,
            ..
        } => {
            let note = match std::fs::read_to_string(&file) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("cannot read {}: {e}", file.display());
                    return ExitCode::FAILURE;
                }
            };
            let checked = async {
                let verifier = match vkey {
                    Some(v) => checkpoint::Verifier::parse(&v)?,
                    None => checkpoint_signer(&config)?.verifier().clone(),
                };
                let store = open_store(&config).await?;
                audit::verify_checkpoint(&store, &verifier, &note).await
            };
            match checked.await {
                Ok(r) => report(vec![r]),
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        ReceiptsCommand::Checkpoint { config, tenant } => {
            let signed = async {
                let signer = checkpoint_signer(&config)?;
                let store = open_store(&config).await?;
                audit::checkpoint_now(&store, &signer, tenant)
                    .await?
                    .ok_or_else(|| format!("tenant {tenant} has no receipts"))
            };
            match signed.await {
                Ok(note) => {
                    print!("{note}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
        ReceiptsCommand::Verify {
            config: Some(config),
            tenant,
            ..
        } => {
            let store = match open_store(&config).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let tenants: Vec<Uuid> = match tenant {
                Some(t) => vec![t],
                None => match store.receipt_tenants().await {
                    Ok(ts) => ts.iter().filter_map(|t| Uuid::parse_str(t).ok()).collect(),
                    Err(e) => {
                        eprintln!("{e}");
                        return ExitCode::FAILURE;
                    }
                },
            };
            let mut reports = Vec::new();
            for t in tenants {
                match audit::verify_tenant(&store, t).await {
                    Ok(r) => reports.push(r),
                    Err(e) => {
                        eprintln!("{e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            report(reports)
        }
        ReceiptsCommand::Verify { .. } => {
            eprintln!("give --config FILE or --file EXPORT");
            ExitCode::FAILURE
        }
        ReceiptsCommand::Export {
            config,
            tenant,
            since,
            out,
        } => {
            if let Some(s) = &since {
                if chrono::DateTime::parse_from_rfc3339(s).is_err() {
                    eprintln!("--since must be an RFC 3339 time, e.g. 2026-01-01T00:00:00Z");
                    return ExitCode::FAILURE;
                }
            }
            let since = since.map(|s| {
                chrono::DateTime::parse_from_rfc3339(&s)
                    .map(|t| substrate_gate::store::ts(t.with_timezone(&chrono::Utc)))
                    .unwrap_or(s)
            });
            let store = match open_store(&config).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let mut sink: Box<dyn std::io::Write> = match &out {
                Some(p) => match std::fs::File::create(p) {
                    Ok(f) => Box::new(std::io::BufWriter::new(f)),
                    Err(e) => {
                        eprintln!("cannot create {}: {e}", p.display());
                        return ExitCode::FAILURE;
                    }
                },
                None => Box::new(std::io::BufWriter::new(std::io::stdout())),
            };
            match audit::export(&store, tenant, since.as_deref(), &mut sink).await {
                Ok(n) => {
                    let _ = sink.flush();
                    eprintln!("exported {n} receipts");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The checkpoint key a config names.
fn checkpoint_signer(config: &std::path::Path) -> Result<checkpoint::Signer, String> {
    let loaded =
        server::load_or_report(config).map_err(|p| format!("invalid config:\n{}", p.join("\n")))?;
    let c = &loaded.config.checkpoints;
    let file = c
        .key_file
        .as_ref()
        .ok_or("the config sets no checkpoints.key_file (give --vkey to verify)")?;
    checkpoint::Signer::from_key_file(&c.name, &loaded.base_dir.join(file))
}

fn report(reports: Vec<audit::ChainReport>) -> ExitCode {
    let mut ok = true;
    for r in &reports {
        match &r.broken {
            None => println!("tenant {}: {} receipts, chain intact", r.tenant, r.receipts),
            Some(b) => {
                ok = false;
                println!(
                    "tenant {}: chain broken after {} good receipts: {b}",
                    r.tenant, r.receipts
                );
            }
        }
    }
    if reports.is_empty() {
        println!("no receipts");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
