//! CPU time and resident memory of a process, of every process whose command line holds a
//! text (the PostgreSQL backends of one database), or CPU time of one process's threads of one
//! name (serve's `sqlite-writer`), read from Linux's `/proc`: what `loadgen` turns into "CPU
//! per answered order" and "RSS" for each server it measures. Elsewhere than Linux every read
//! fails and loadgen prints `-`.

use std::collections::BTreeMap;
use std::time::Duration;

/// `USER_HZ`, the unit of `utime`/`stime` in `/proc/PID/stat`. Linux fixes it at 100 in its
/// user-space ABI whatever the kernel's own `HZ` (`getconf CLK_TCK` prints it), so a 10 ms
/// resolution: over a 10 s window of 11,000 orders that is under 1 µs per order.
const TICKS_PER_SECOND: u64 = 100;

/// One reading of a process, or of a set of processes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcSample {
    /// User + system CPU time of every thread since each process started, by PID.
    pub cpu: BTreeMap<u32, Duration>,
    /// Resident set size, summed; `None` for threads (they share their process's memory).
    pub rss_bytes: Option<u64>,
}

impl ProcSample {
    /// CPU spent between `earlier` and this reading: per PID, so a process that appeared in
    /// between counts from zero. (One that ended in between is lost: its time is gone.)
    pub fn cpu_since(&self, earlier: &ProcSample) -> Duration {
        self.cpu
            .iter()
            .map(|(pid, now)| now.saturating_sub(earlier.cpu.get(pid).copied().unwrap_or_default()))
            .sum()
    }
}

/// Reads `pid`'s CPU time (`/proc/PID/stat`) and resident memory (`VmRSS` of
/// `/proc/PID/status`, in kB there, so no page-size guess).
pub fn sample(pid: u32) -> std::io::Result<ProcSample> {
    let (cpu, rss_bytes) = read(pid)?;
    Ok(ProcSample {
        cpu: BTreeMap::from([(pid, cpu)]),
        rss_bytes: Some(rss_bytes),
    })
}

/// Reads every process (but this one) whose command line contains `text`, e.g. the
/// PostgreSQL backends serving one database (their titles name it).
pub fn sample_matching(text: &str) -> std::io::Result<ProcSample> {
    let me = std::process::id();
    let mut sample = ProcSample {
        rss_bytes: Some(0),
        ..ProcSample::default()
    };
    for pid in numbered("/proc")? {
        let pid = pid?;
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue; // Gone since the listing.
        };
        if pid == me || !String::from_utf8_lossy(&cmdline).contains(text) {
            continue;
        }
        if let Ok((cpu, rss)) = read(pid) {
            sample.cpu.insert(pid, cpu);
            sample.rss_bytes = sample.rss_bytes.map(|sum| sum + rss);
        }
    }
    Ok(sample)
}

/// Reads the CPU time of `pid`'s threads named `name` (`/proc/PID/task/TID/comm`; Linux keeps
/// the first 15 bytes of a thread's name, so a longer `name` matches by that prefix), by TID:
/// how much of a process one of its threads spends, e.g. serve's `sqlite-writer`. No RSS.
pub fn sample_threads(pid: u32, name: &str) -> std::io::Result<ProcSample> {
    let kept = name.get(..name.len().min(15)).unwrap_or(name);
    let mut sample = ProcSample::default();
    for tid in numbered(&format!("/proc/{pid}/task"))? {
        let tid = tid?;
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) else {
            continue; // Ended since the listing.
        };
        if comm.trim_end_matches('\n') != kept {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
            && let Some(cpu) = cpu_of(&stat)
        {
            sample.cpu.insert(tid, cpu);
        }
    }
    Ok(sample)
}

/// The entries of `dir` named by a number (`/proc`'s processes, `/proc/PID/task`'s threads).
fn numbered(dir: &str) -> std::io::Result<impl Iterator<Item = std::io::Result<u32>>> {
    Ok(std::fs::read_dir(dir)?.filter_map(|entry| match entry {
        Ok(entry) => entry.file_name().to_str()?.parse::<u32>().ok().map(Ok),
        Err(e) => Some(Err(e)),
    }))
}

fn read(pid: u32) -> std::io::Result<(Duration, u64)> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok((
        cpu_of(&stat).ok_or_else(|| invalid("unreadable /proc/PID/stat"))?,
        rss_of(&status).ok_or_else(|| invalid("no VmRSS in /proc/PID/status"))?,
    ))
}

/// `utime + stime` of a `/proc/PID/stat` line. The command name (field 2) is in parentheses and
/// may itself hold spaces or parentheses, so fields are counted from the LAST `)`.
pub fn cpu_of(stat: &str) -> Option<Duration> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
    // cmajflt utime(14) stime(15): utime is the 12th field after the `)`.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime + stime;
    Some(
        Duration::from_secs(ticks / TICKS_PER_SECOND)
            + Duration::from_millis((ticks % TICKS_PER_SECOND) * 1000 / TICKS_PER_SECOND),
    )
}

/// `VmRSS` of a `/proc/PID/status` text, in bytes.
pub fn rss_of(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command name with spaces and parentheses does not shift the fields.
    #[test]
    fn cpu_is_utime_plus_stime_counted_from_the_last_parenthesis() {
        let stat = "4242 (tokio (rt) worker) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 130 0 0 20 0 9 0 100 1000000 2000 18446744073709551615";
        assert_eq!(cpu_of(stat), Some(Duration::from_millis(3_800)));
        assert_eq!(cpu_of("garbage"), None);
        assert_eq!(cpu_of("1 (x) S 1 2"), None);
    }

    #[test]
    fn rss_is_read_from_vmrss_in_kilobytes() {
        let status = "Name:\tcheckout\nVmPeak:\t  900 kB\nVmRSS:\t   51200 kB\nThreads:\t9\n";
        assert_eq!(rss_of(status), Some(51_200 * 1024));
        assert_eq!(rss_of("Name:\tkthreadd\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_can_be_sampled_but_never_matches_itself() {
        let me = std::process::id();
        let sample = sample(me).expect("/proc/self is readable on Linux");
        assert!(sample.rss_bytes.is_some_and(|rss| rss > 0));
        assert!(sample.cpu.contains_key(&me));
        let name = std::env::args().next().unwrap_or_default();
        let matching = sample_matching(&name).expect("/proc is listable on Linux");
        assert!(!matching.cpu.contains_key(&me));
    }

    /// A process that starts between two readings counts from zero; a shared one by its delta.
    #[test]
    fn cpu_since_is_the_sum_of_per_process_deltas() {
        let ms = Duration::from_millis;
        let before = ProcSample {
            cpu: BTreeMap::from([(1, ms(100)), (2, ms(50))]),
            rss_bytes: None,
        };
        let after = ProcSample {
            cpu: BTreeMap::from([(1, ms(130)), (3, ms(20))]),
            rss_bytes: None,
        };
        assert_eq!(after.cpu_since(&before), ms(50));
    }

    /// A named thread is found among its process's threads by its name (longer than Linux
    /// keeps), under its TID, with the CPU time it burnt; a name no thread has matches nothing.
    #[cfg(target_os = "linux")]
    #[test]
    fn one_named_thread_of_a_process_is_sampled_by_itself() {
        let (started, ready) = std::sync::mpsc::channel();
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        let busy = std::thread::Builder::new()
            .name("probe-busy-thread-name".to_owned())
            .spawn(move || {
                let tid = std::fs::read_link("/proc/thread-self")
                    .ok()
                    .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok());
                // Spins until its own stat line shows three clock ticks of CPU (30 ms): on a
                // loaded machine a fixed spell of wall time may earn the thread less than the
                // 20 ms asserted below. At most 10 s.
                let me = std::process::id();
                let burnt = |tid: u32| {
                    sample_threads(me, "probe-busy-thread-name")
                        .ok()
                        .and_then(|s| s.cpu.get(&tid).copied())
                        .unwrap_or_default()
                };
                let spun = std::time::Instant::now();
                while spun.elapsed() < Duration::from_secs(10)
                    && tid.is_some_and(|t| burnt(t) < Duration::from_millis(30))
                {
                    for _ in 0..10_000 {
                        std::hint::black_box(spun.elapsed());
                    }
                }
                started.send(tid).expect("the test waits for the thread");
                finished.recv().ok();
            })
            .expect("a thread can be spawned");
        let tid = ready
            .recv()
            .expect("the thread reports its TID")
            .expect("/proc/thread-self names the thread's TID on Linux");
        let me = std::process::id();
        let sample = sample_threads(me, "probe-busy-thread-name").expect("/proc/self/task");
        assert_eq!(sample.cpu.keys().copied().collect::<Vec<_>>(), vec![tid]);
        assert!(sample.cpu[&tid] >= Duration::from_millis(20), "{sample:?}");
        assert_eq!(sample.rss_bytes, None);
        let none = sample_threads(me, "no-such-thread").expect("/proc/self/task");
        assert!(none.cpu.is_empty());
        finish.send(()).expect("the thread waits");
        busy.join().expect("the thread ends");
    }
}
