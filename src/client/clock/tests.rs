//! The clock's readings under injected suspensions and drift, and the system clock's basics. Real
//! (short) sleeps under plain tokio; simulated ones under `--cfg madsim`.

use std::time::Duration;

use super::*;

#[tokio::test]
async fn a_suspension_stops_the_monotonic_reading_but_not_the_suspend_aware_one() {
    let faults = ClockFaults::new();
    let clock = Clock::with_faults(faults.clone());
    let stopping = clock.stopping();
    faults.suspended_for(Duration::from_secs(30));
    assert!(clock.now_ms() >= 30_000, "the suspend-aware clock counts the suspension: {}", clock.now_ms());
    assert!(stopping.now_ms() < 1_000, "the monotonic clock does not: {}", stopping.now_ms());

    // While suspended (the simulation's clock-stop), only the suspend-aware reading advances.
    let (aware, monotonic) = (clock.now_ms(), stopping.now_ms());
    faults.suspend();
    crate::time::sleep(Duration::from_millis(40)).await;
    assert!(clock.now_ms() >= aware + 40);
    assert_eq!(stopping.now_ms(), monotonic, "stopped while suspended");
    faults.resume();
    crate::time::sleep(Duration::from_millis(20)).await;
    assert!(stopping.now_ms() >= monotonic + 20, "runs again after resume");
}

#[tokio::test]
async fn a_drifting_clock_runs_at_its_rate_from_the_change_on() {
    let faults = ClockFaults::new();
    let clock = Clock::with_faults(faults.clone());
    faults.set_rate_ppm(RATE_NOMINAL_PPM / 2);
    let (start, started_ms) = (Instant::now(), clock.now_ms());
    crate::time::sleep(Duration::from_millis(80)).await;
    let true_ms = duration_ms(start.elapsed());
    let clock_ms = clock.now_ms() - started_ms;
    assert!(clock_ms * 4 <= true_ms * 3 && clock_ms * 4 >= true_ms, "half rate: {clock_ms} ms of {true_ms} ms");
    // Readings never jump at a rate change.
    let before = clock.now_ms();
    faults.set_rate_ppm(RATE_NOMINAL_PPM);
    assert!(clock.now_ms() >= before && clock.now_ms() <= before + 5);
}

#[tokio::test]
async fn sleeping_until_a_deadline_notices_a_suspension_soon_after_resume() {
    let faults = ClockFaults::new();
    let clock = Clock::with_faults(faults.clone());
    let deadline_ms = clock.now_ms() + 60_000;
    let sleeper = tokio::spawn({
        let clock = clock.clone();
        async move { clock.sleep_until_ms(deadline_ms).await }
    });
    crate::time::sleep(Duration::from_millis(10)).await;
    // A tokio timer for the deadline would still wait a minute: monotonic time did not move.
    faults.suspended_for(Duration::from_secs(120));
    let woke = crate::time::timeout(Duration::from_millis(4 * RECHECK_MS), sleeper).await;
    assert!(woke.is_ok(), "the deadline passed during the suspension and was noticed on the next re-check");
    assert!(clock.now_ms() >= deadline_ms);
}

#[cfg(not(madsim))]
#[tokio::test]
async fn the_system_clock_advances_with_time_and_converts_to_tokio_instants() {
    let clock = Clock::new();
    let start = clock.now_ms();
    crate::time::sleep(Duration::from_millis(30)).await;
    let now_ms = clock.now_ms();
    assert!(now_ms >= start + 29, "{start} -> {now_ms}");
    assert!(clock.stopping().now_ms() >= start + 29);
    let at = clock.instant_at(now_ms + 1_000);
    let back = clock.ms_at(at);
    assert!(back.abs_diff(now_ms + 1_000) <= 2, "{back} vs {}", now_ms + 1_000);
}

#[cfg(all(not(madsim), any(target_os = "linux", target_os = "android")))]
#[test]
fn the_system_clock_reads_boottime() {
    // CLOCK_BOOTTIME >= CLOCK_MONOTONIC on Linux (equal unless the machine was ever suspended).
    let boottime = system::suspend_aware_us().expect("CLOCK_BOOTTIME");
    let monotonic = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let monotonic_us = u64::try_from(monotonic.tv_sec).unwrap() * 1_000_000;
    assert!(boottime + 1_000_000 >= monotonic_us, "boottime {boottime} us, monotonic {monotonic_us} us");
}
