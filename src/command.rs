//! A configured command (the admin page's reboot, the update helper's stop and start), run
//! directly with no shell, bounded in time, its failure told with the head of what it wrote to
//! stderr. Blocking: callers on the event loop run it on a blocking thread.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The most of a failed command's stderr kept for its error.
const STDERR_CAP: u64 = 2048;

/// Runs `cmd` (program and arguments) and waits at most `within`; a command still running then
/// is killed.
pub fn run(cmd: &[String], within: Duration) -> Result<(), String> {
    let (program, args) = cmd.split_first().ok_or("no command is set")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{program} did not finish within {} s",
                within.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.success() {
        return Ok(());
    }
    let mut err = String::new();
    if let Some(stderr) = child.stderr.take() {
        let _ = stderr.take(STDERR_CAP).read_to_string(&mut err);
    }
    Err(format!("{program} ended with {status}: {}", err.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_and_its_failure_is_told() {
        let sh = |s: &str| vec!["/bin/sh".to_owned(), "-c".to_owned(), s.to_owned()];
        assert_eq!(run(&sh("exit 0"), Duration::from_secs(5)), Ok(()));
        let e = run(
            &sh("echo 'Access denied' >&2; exit 1"),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(e.contains("Access denied"), "{e}");
        let e = run(&sh("sleep 5"), Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("did not finish"), "{e}");
        assert!(run(&[], Duration::from_secs(1)).is_err());
    }
}
