//! Resident-set measurement for the bytes-per-post figure.
//!
//! The figure is an RSS delta (`/proc/self/statm`) around loading one store. Between stores the
//! previous one is dropped and [`release_free_memory`] hands freed heap pages back to the
//! kernel, so the second store's delta does not hide inside memory the first one freed.

/// Resident set size of this process in bytes (0 where `/proc` is unavailable).
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let resident_pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    resident_pages * page_size()
}

/// Minor page faults of this process so far (0 where unavailable): a load that faults in
/// fewer pages than its store occupies ran partly on memory the process already had.
pub fn minor_faults() -> u64 {
    // SAFETY: `usage` is a valid out-pointer for the call, which only fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is a valid target.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    usage.ru_minflt as u64
}

/// Anonymous memory of this process backed by transparent huge pages, in bytes
/// (`AnonHugePages` of `/proc/self/smaps_rollup`; 0 where unavailable): a load whose huge
/// mappings got 4 KiB pages instead faults 512 times as often and walks more page tables.
pub fn anon_huge_bytes() -> u64 {
    proc_kib_field("/proc/self/smaps_rollup", "AnonHugePages:") * 1024
}

/// The value of the `field` line (`Name:  123 kB`) of the `/proc` file at `path`, in KiB; 0
/// where the file or the line is missing.
fn proc_kib_field(path: &str, field: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0;
    };
    text.lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 } else { 4096 }
}

/// Returns free heap memory to the kernel (glibc `malloc_trim`), so RSS reflects live data.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Waits `secs` seconds (none for 0), so that memory freed before a timed load has gone back
/// to the host and every timed load faults in pages that cost the same: this virtual machine
/// hands freed memory back after a few seconds, and faulting such pages in again costs ~20x
/// more than faulting pages freed just before.
pub fn settle(secs: f64) {
    if secs > 0.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(secs));
    }
}

/// Peak resident set size of this process so far in bytes (`VmHWM`; 0 where unavailable).
pub fn peak_rss_bytes() -> u64 {
    proc_kib_field("/proc/self/status", "VmHWM:") * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kib_field_is_read_from_its_line_and_is_zero_when_missing() {
        let path = std::env::temp_dir().join(format!("thunder-kib-{}", std::process::id()));
        std::fs::write(
            &path,
            "Rss:  1200 kB\nAnonHugePages:    4096 kB\nSwap: 0 kB\n",
        )
        .unwrap();
        let path = path.to_str().unwrap();
        assert_eq!(proc_kib_field(path, "AnonHugePages:"), 4096);
        assert_eq!(proc_kib_field(path, "Rss:"), 1200);
        assert_eq!(proc_kib_field(path, "VmHWM:"), 0);
        std::fs::remove_file(path).unwrap();
        assert_eq!(proc_kib_field(path, "Rss:"), 0, "a missing file reads as 0");
    }

    #[test]
    fn this_process_has_a_peak_at_least_its_resident_set() {
        let (rss, peak) = (rss_bytes(), peak_rss_bytes());
        assert!(rss > 0);
        assert!(peak >= rss, "peak {peak} below resident {rss}");
    }
}
