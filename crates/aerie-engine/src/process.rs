//! The rules of every process aerie starts (a serving engine, the Python capture worker): it
//! dies with aerie, it can be stopped with everything it forked, and when it fails aerie's last
//! line names its own root cause, read from what it wrote.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Have the kernel send the child SIGTERM when aerie dies, even by SIGKILL, and with
/// `own_group`, put it in a process group of its own (so its workers can be stopped together,
/// [`stop_group`]). Otherwise a killed aerie leaves an engine holding the port and the memory, or
/// a capture worker that keeps writing and holds the dataset's lock.
pub fn die_with_parent(c: &mut Command, own_group: bool) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        if own_group {
            c.process_group(0);
        }
        // SAFETY: the closure runs in the forked child before exec and only calls prctl,
        // getppid and _exit, which are async-signal-safe; the death signal survives exec.
        unsafe {
            let parent = libc::getpid();
            c.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // aerie may have died between fork and prctl: then nobody would signal us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (c, own_group);
}

/// Stop a child started with its own process group: SIGTERM to the group, SIGKILL to what is
/// left after `grace` (workers that outlived their parent die with the group).
pub fn stop_group(mut child: Child, grace: Duration) {
    #[cfg(target_os = "linux")]
    {
        let pgid = child.id() as libc::pid_t;
        // SAFETY: plain syscalls on the process group this child was started in.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < grace {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (grace, Instant::now());
    let _ = child.kill();
    let _ = child.wait();
}

/// The last `max` bytes of a log file, from a line start, for error messages.
pub fn log_tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    match (len > max, text.find('\n')) {
        (true, Some(i)) => text[i + 1..].to_string(),
        _ => text,
    }
}

/// The line of a failed process's output that names why it failed, by one rule: the FIRST
/// Python exception line (`SomethingError: message` or `SomethingException: message`, after
/// any `(Process pid=N)` prefix vLLM puts on its workers' lines). The first raised exception is
/// the cause; the ones after it are consequences (vLLM's API server ends with `RuntimeError:
/// Engine core initialization failed. See root cause above.`). Without one: the last line
/// logged at ERROR level; without that, none.
pub fn root_cause(output: &str) -> Option<String> {
    output.lines().find_map(exception_line).map(str::to_string).or_else(|| {
        output
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with("ERROR") || l.contains(" ERROR ") || l.contains("[ERROR]"))
            .map(str::to_string)
    })
}

/// The exception part of a line `(prefix) Name: message` where `Name` ends in `Error` or
/// `Exception` (dotted module paths allowed), or `None`: the lines [`root_cause`] looks for.
pub fn exception_line(line: &str) -> Option<&str> {
    let line = line.trim();
    let line = match line.strip_prefix('(') {
        Some(rest) if rest.contains(") ") => &rest[rest.find(") ")? + 2..],
        _ => line,
    };
    let (name, message) = line.split_once(": ")?;
    let plain = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    let class = name.rsplit('.').next().unwrap_or(name);
    (plain && !message.trim().is_empty() && (class.ends_with("Error") || class.ends_with("Exception"))).then_some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_starts_at_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        std::fs::write(&p, "first line\nsecond line\nthird\n").unwrap();
        assert_eq!(log_tail(&p, 12), "third\n");
        assert_eq!(log_tail(&p, 1000), "first line\nsecond line\nthird\n");
    }

    /// The end of a real vLLM CPU log (0.32, 24 GiB machine with 11.5 GiB free, as issue 34
    /// measured it): the cause is the worker's ValueError, not the API server's last words.
    #[test]
    fn the_root_cause_of_a_vllm_start_is_the_first_exception() {
        let log = "\
INFO 12-03 20:11:02 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: model='target'
WARNING 12-03 20:11:03 [cpu.py:120] Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using 4 by default.
(EngineCore_DP0 pid=4121) Process EngineCore_DP0:
(EngineCore_DP0 pid=4121) Traceback (most recent call last):
(EngineCore_DP0 pid=4121)   File \"/venv/lib/python3.12/site-packages/vllm/v1/worker/cpu_worker.py\", line 88, in init_device
(EngineCore_DP0 pid=4121) ValueError: Available memory on node 0 (11.52/23.54 GiB) on startup is less than desired CPU memory utilization (0.85, 20.01 GiB)
ERROR 12-03 20:11:09 [core.py:708] EngineCore failed to start.
Traceback (most recent call last):
  File \"/venv/bin/vllm\", line 8, in <module>
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
";
        assert_eq!(
            root_cause(log).as_deref(),
            Some(
                "ValueError: Available memory on node 0 (11.52/23.54 GiB) on startup is less than desired CPU memory utilization (0.85, 20.01 GiB)"
            )
        );
        assert_eq!(
            root_cause("INFO a\nERROR 12-03 [x.py:1] it broke\nINFO b\n").as_deref(),
            Some("ERROR 12-03 [x.py:1] it broke")
        );
        assert_eq!(
            root_cause("torch.OutOfMemoryError: CUDA out of memory").as_deref(),
            Some("torch.OutOfMemoryError: CUDA out of memory")
        );
        assert_eq!(root_cause("note: Error: handled\nplain text\n"), None);
    }
}
