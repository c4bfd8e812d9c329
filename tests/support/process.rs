//! Running the binary under a deadline.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to its end, killing it (and failing the test) if it has not finished within
/// `limit`: a generous bound that tells linear from quadratic (or a refusal at once from a
/// minute of parsing), never a measurement. Its output goes through files, so a large
/// output cannot block it.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
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
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output {
        status,
        stdout: std::fs::read(&so).expect("stdout"),
        stderr: std::fs::read(&se).expect("stderr"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    out
}
