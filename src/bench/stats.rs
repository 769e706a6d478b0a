//! Percentiles over recorded samples, and what `/proc` says about a process: CPU time (utime +
//! stime) and resident memory (VmRSS, peak VmHWM).

use std::sync::OnceLock;

use serde::Serialize;

/// Percentiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    /// Summarises samples given in microseconds (sorts them); `None` when there are none.
    pub fn of_micros(samples: &mut [u64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Some(Summary {
            count: samples.len(),
            mean_ms: sum as f64 / samples.len() as f64 / 1000.0,
            p50_ms: ms(percentile(samples, 50.0)),
            p90_ms: ms(percentile(samples, 90.0)),
            p99_ms: ms(percentile(samples, 99.0)),
            max_ms: ms(samples[samples.len() - 1]),
        })
    }
}

/// The nearest-rank percentile of sorted, non-empty samples (0 for none).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Clock ticks per second of `/proc/*/stat` times (`getconf CLK_TCK`, 100 if unknown).
pub fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|&t| t > 0)
            .unwrap_or(100)
    })
}

/// Which process to read: a pid, or this process.
#[derive(Debug, Clone, Copy)]
pub enum Proc {
    Pid(u32),
    This,
}

impl Proc {
    fn path(self, file: &str) -> String {
        match self {
            Proc::Pid(pid) => format!("/proc/{pid}/{file}"),
            Proc::This => format!("/proc/self/{file}"),
        }
    }

    /// User + system CPU time so far, in seconds.
    pub fn cpu_seconds(self) -> std::io::Result<f64> {
        let stat = std::fs::read_to_string(self.path("stat"))?;
        let ticks = parse_cpu_ticks(&stat).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "unreadable /proc stat")
        })?;
        Ok(ticks as f64 / clock_ticks() as f64)
    }

    /// A `kB` line of `/proc/PID/status` (`VmRSS`, `VmHWM`), in kB.
    pub fn status_kb(self, field: &str) -> std::io::Result<u64> {
        let status = std::fs::read_to_string(self.path("status"))?;
        parse_status_kb(&status, field).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no {field} in /proc status"),
            )
        })
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line; the command name in
/// parentheses may contain spaces, so fields are counted after the last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    // After ")": field 3 (state) is index 0, so utime (14) is index 11 and stime (15) index 12.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn parse_status_kb(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut samples: Vec<u64> = (1..=100).rev().map(|n| n * 1000).collect();
        let s = Summary::of_micros(&mut samples).unwrap();
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p90_ms, 90.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.max_ms, 100.0);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert!(Summary::of_micros(&mut []).is_none());
    }

    #[test]
    fn proc_files_are_parsed() {
        let stat = "1234 (tah (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        let status = "Name:\ttah\nVmHWM:\t   12345 kB\nVmRSS:\t    999 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM"), Some(12345));
        assert_eq!(parse_status_kb(status, "VmRSS"), Some(999));
        assert_eq!(parse_status_kb(status, "VmSwap"), None);
        assert!(Proc::This.cpu_seconds().is_ok());
        assert!(Proc::This.status_kb("VmRSS").unwrap() > 0);
    }
}
