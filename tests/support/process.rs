//! Running the binary under a deadline.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to its end, killing it (and failing the test) if it has not finished within
/// `limit`: a generous bound that tells linear from quadratic (or a refusal at once from a
/// minute of parsing), never a measurement. Its output goes through files, so a large
/// output cannot block it.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    watched(cmd, limit).0
}

/// [`output_within`], and the most memory the process was seen to hold (its peak resident
/// memory, `VmHWM` of /proc/PID/status, in bytes, read as it runs; `None` without /proc).
pub fn watched(cmd: &mut Command, limit: Duration) -> (Output, Option<u64>) {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("within-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (so, se) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&so).expect("stdout file"))
        .stderr(std::fs::File::create(&se).expect("stderr file"))
        .spawn()
        .expect("the binary runs");
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak: Option<u64> = None;
    let started = Instant::now();
    let status = loop {
        // Read before asking whether it ended: a process that has exited (a zombie until
        // waited for) no longer shows its memory.
        if let Some(hwm) = std::fs::read_to_string(&status_file).ok().and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        }) {
            peak = Some(peak.unwrap_or(0).max(hwm * 1024));
        }
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = Output {
        status,
        stdout: std::fs::read(&so).expect("stdout"),
        stderr: std::fs::read(&se).expect("stderr"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    (out, peak)
}
