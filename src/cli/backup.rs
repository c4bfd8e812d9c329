//! `ichor-rules backup download`: fetches one etcd snapshot from a backup's store to a file
//! and checks it (its trailing sha256, as `talosctl etcd snapshot` does), so the person
//! restoring a cluster has it in hand (issue 36; docs/operators.md, "Restoring etcd from a
//! backup"). Offline: it talks to the store only, never to a cluster.
//!
//! The access keys are read from the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`), never from the command line (which other users of the machine
//! can read in the process list), and never printed. The file is written as `<out>.part`,
//! synced, checked, then renamed to `<out>`: a snapshot that does not check out leaves no
//! file.

use super::{EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK};
use crate::runtime::objects::StoreSpec;
use crate::runtime::store::{Keys, PutError, Store};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub command: BackupCommand,
}

#[derive(Subcommand, Debug)]
pub enum BackupCommand {
    /// Download one snapshot from the store to a file and check it. Exit 0: the file is a
    /// whole snapshot (its size and sha256 printed); 1: the object is not a sound snapshot
    /// (no file is left); 2: bad usage, or the store could not be read.
    Download(DownloadArgs),
}

#[derive(Args, Debug)]
pub struct DownloadArgs {
    /// The store's URL, as the backup's spec.store.endpoint (`https://host[:port]`).
    #[arg(long)]
    pub endpoint: String,
    /// The bucket (spec.store.bucket).
    #[arg(long)]
    pub bucket: String,
    /// The region to sign for (spec.store.region); `us-east-1` by default.
    #[arg(long)]
    pub region: Option<String>,
    /// The snapshot's object key, with its prefix (status.lastSnapshot.key of the backup).
    #[arg(long)]
    pub key: String,
    /// The file to write (it must not exist).
    #[arg(long, short)]
    pub out: PathBuf,
    /// A file holding the encryption key of an encrypted snapshot (the value of the
    /// backup's spec.encryption.keySecretRef: 32 raw bytes, base64 of them or 64 hex
    /// digits), e.g. `<(kubectl get secret ... -o jsonpath='{.data.key}' | base64 -d)`.
    /// The snapshot is decrypted as it streams, then checked.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
}

pub fn run(args: &BackupArgs) -> u8 {
    match &args.command {
        BackupCommand::Download(d) => download(d),
    }
}

fn download(d: &DownloadArgs) -> u8 {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(access_key_id), Some(secret_access_key)) =
        (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
    else {
        eprintln!(
            "error: the store's access keys are read from the environment: set AWS_ACCESS_KEY_ID \
             and AWS_SECRET_ACCESS_KEY (the keys of the backup's spec.store.credentialsSecretRef)"
        );
        return EXIT_BAD_INPUT;
    };
    if d.out.exists() {
        eprintln!(
            "error: {} exists; name a new file (a snapshot is never written over another)",
            d.out.display()
        );
        return EXIT_BAD_INPUT;
    }
    let spec = StoreSpec {
        endpoint: d.endpoint.clone(),
        bucket: d.bucket.clone(),
        prefix: None,
        region: d.region.clone(),
        credentials_secret_ref: Default::default(),
    };
    let keys = Keys {
        access_key_id,
        secret_access_key,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let key = match &d.key_file {
        None => None,
        Some(path) => {
            let read =
                std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()));
            match read.and_then(|bytes| {
                crate::runtime::crypt::Key::from_secret(&bytes)
                    .map_err(|e| format!("{}: {e}", path.display()))
            }) {
                Ok(k) => Some(k),
                Err(e) => {
                    eprintln!("error: --key-file {e}");
                    return EXIT_BAD_INPUT;
                }
            }
        }
    };
    let mut part = d.out.clone().into_os_string();
    part.push(".part");
    let part = PathBuf::from(part);
    let outcome = runtime.block_on(async {
        let store = Store::new(&spec, &keys, Duration::from_secs(60)).map_err(PutError::Store)?;
        let mut file = tokio::fs::File::create(&part)
            .await
            .map_err(|e| PutError::Store(crate::runtime::store::StoreError::Write(e)))?;
        let checked = store.get_snapshot(&d.key, &mut file, key.as_ref()).await?;
        file.sync_all()
            .await
            .map_err(|e| PutError::Store(crate::runtime::store::StoreError::Write(e)))?;
        Ok::<_, PutError>(checked)
    });
    match outcome {
        Ok(checked) => match std::fs::rename(&part, &d.out) {
            Ok(()) => {
                let revision = match &checked.revision {
                    Ok(r) => format!("etcd revision {r}"),
                    Err(why) => format!("etcd revision not read: {why}"),
                };
                println!(
                    "{}: {} bytes, a whole etcd snapshot ({revision}; sha256 of the database {})",
                    d.out.display(),
                    checked.size,
                    checked.sha256
                );
                EXIT_OK
            }
            Err(e) => {
                eprintln!(
                    "error: renaming {} to {}: {e}",
                    part.display(),
                    d.out.display()
                );
                EXIT_BAD_INPUT
            }
        },
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            eprintln!("error: {e}");
            match e {
                PutError::Check(_) | PutError::Size { .. } | PutError::Crypt(_) => EXIT_FINDINGS,
                PutError::Store(_) | PutError::Encrypted => EXIT_BAD_INPUT,
            }
        }
    }
}
