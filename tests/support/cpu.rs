//! This process's CPU time, for the benchmarks that print CPU per unit of work.

use std::time::Duration;

/// User + system CPU time of this process so far (`utime` + `stime` of `/proc/self/stat`, in
/// clock ticks of 10 ms); zero where there is no procfs.
pub fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name is in parentheses and may hold spaces; the fields after it are fixed, and
    // some of them (the state, a -1 terminal group) are not unsigned numbers, so count them all.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the whole line, 11 and 12 after the name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}
