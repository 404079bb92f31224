//! What the process's surroundings allow it, as metrics, so the alert rules can compare
//! resident memory and snapshot sizes with them without cAdvisor or node-exporter:
//!
//! - `memory_limit_bytes`: `--memory-limit-bytes`, or else the memory cgroup's limit read at
//!   start-up ([`MemoryLimit::detect`]); absent when there is no limit.
//! - `snapshot_volume_size_bytes` and `snapshot_volume_free_bytes`: `statvfs` of the filesystem
//!   holding `--snapshot-dir`, at each scrape; absent without a snapshot directory.
//!
//! [`ResourceCollector`] is part of [`ProcessMetrics`](crate::telemetry::metrics::ProcessMetrics) and exports
//! nothing until [`ResourceCollector::install`] hands it the start-up settings.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge, Metric, MetricFamily, MetricType};

use crate::telemetry::registry::family_descs;

/// A limit this large or larger means "no limit": cgroup v1 writes the largest page-aligned
/// `i64` (9223372036854771712) for an unlimited group.
const UNLIMITED_FROM: u64 = 1 << 62;

/// Where the cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The memory limit of the process, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryLimit {
    /// `--memory-limit-bytes`.
    Flag(u64),
    /// The lowest limit of the process's memory cgroup and its ancestors.
    Cgroup {
        /// The limit in bytes.
        bytes: u64,
        /// The file it was read from.
        file: PathBuf,
    },
    /// No limit: `--memory-limit-bytes 0`, or no cgroup file with a limit.
    Unlimited,
}

impl MemoryLimit {
    /// `--memory-limit-bytes` when given (0: no limit), else the memory cgroup's limit.
    pub fn detect(flag: Option<u64>) -> Self {
        match flag {
            Some(0) => Self::Unlimited,
            Some(bytes) => Self::Flag(bytes),
            None => {
                let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
                lowest_cgroup_limit(&limit_files(&membership, Path::new(CGROUP_ROOT))).map_or(
                    Self::Unlimited,
                    |(bytes, file)| Self::Cgroup { bytes, file },
                )
            }
        }
    }

    /// The limit in bytes, if there is one.
    pub fn bytes(&self) -> Option<u64> {
        match self {
            Self::Flag(bytes) | Self::Cgroup { bytes, .. } => Some(*bytes),
            Self::Unlimited => None,
        }
    }
}

/// The content of a `memory.max` (cgroup v2) or `memory.limit_in_bytes` (v1) file as a limit:
/// `None` for `max`, v1's "unlimited" and anything that is not a number.
pub fn parse_cgroup_limit(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&bytes| bytes < UNLIMITED_FROM)
}

/// The files that may hold the process's memory limit, given `/proc/self/cgroup` and the
/// cgroup mount root: for the v2 hierarchy (`0::/path`) each `memory.max`, and for a v1
/// `memory` controller each `memory.limit_in_bytes`, of the process's cgroup and of every
/// ancestor up to the root. A limit anywhere on the way applies, so the lowest one counts.
/// In a container the paths listed may be the host's and missing, while the root is the
/// container's own cgroup: missing files are skipped by [`lowest_cgroup_limit`].
pub fn limit_files(proc_self_cgroup: &str, root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (mount, file) = if id == "0" && controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut group = mount.clone();
        group.extend(Path::new(path).components().filter_map(|c| match c {
            std::path::Component::Normal(name) => Some(name),
            _ => None,
        }));
        for dir in group.ancestors() {
            files.push(dir.join(file));
            if dir == mount {
                break;
            }
        }
    }
    files
}

/// The lowest limit among the readable `files`, with the file it came from.
pub fn lowest_cgroup_limit(files: &[PathBuf]) -> Option<(u64, PathBuf)> {
    files
        .iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(file).ok()?;
            Some((parse_cgroup_limit(&text)?, file.clone()))
        })
        .min_by_key(|(bytes, _)| *bytes)
}

/// Size and free space of a filesystem, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeSpace {
    /// Total size.
    pub size: u64,
    /// Space an unprivileged writer can still use (`f_bavail`: the server does not run as
    /// root, so blocks reserved for root are not free for it).
    pub free: u64,
}

/// The space of the filesystem holding `dir`, or the directory it would be created in while
/// it does not exist yet (its nearest existing ancestor); `None` when even that cannot be
/// read.
pub fn volume_space(dir: &Path) -> Option<VolumeSpace> {
    let existing = dir
        .ancestors()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .find(|p| p.exists())?;
    let stat = rustix::fs::statvfs(existing).ok()?;
    Some(VolumeSpace {
        size: stat.f_blocks.saturating_mul(stat.f_frsize),
        free: stat.f_bavail.saturating_mul(stat.f_frsize),
    })
}

/// What the collector exports, fixed at start-up.
#[derive(Debug)]
struct Settings {
    memory_limit: Option<u64>,
    snapshot_dir: Option<PathBuf>,
}

/// Exports `memory_limit_bytes` and the snapshot volume's space once configured
/// ([`ResourceCollector::configure`]); the volume is read at each scrape.
#[derive(Clone, Debug)]
pub struct ResourceCollector {
    descs: Vec<Desc>,
    settings: Arc<OnceLock<Settings>>,
}

const MEMORY_LIMIT: &str = "memory_limit_bytes";
const VOLUME_SIZE: &str = "snapshot_volume_size_bytes";
const VOLUME_FREE: &str = "snapshot_volume_free_bytes";

impl ResourceCollector {
    /// Name, type and help of each family.
    pub const FAMILIES: &[(&str, &str, &str)] = &[
        (
            MEMORY_LIMIT,
            "gauge",
            "Memory limit of the process in bytes: --memory-limit-bytes, else the memory cgroup's limit (memory.max; v1: memory.limit_in_bytes) read at start-up; absent when unlimited",
        ),
        (
            VOLUME_SIZE,
            "gauge",
            "Size in bytes of the filesystem holding --snapshot-dir (absent without one)",
        ),
        (
            VOLUME_FREE,
            "gauge",
            "Bytes the server can still write on the filesystem holding --snapshot-dir (absent without one)",
        ),
    ];

    pub(crate) fn new() -> Self {
        Self {
            descs: family_descs(Self::FAMILIES),
            settings: Arc::new(OnceLock::new()),
        }
    }

    /// Sets the memory limit and the snapshot directory to export. The first call wins; a
    /// later one changes nothing and returns `false`.
    pub fn configure(&self, memory_limit: Option<u64>, snapshot_dir: Option<PathBuf>) -> bool {
        self.settings
            .set(Settings {
                memory_limit,
                snapshot_dir,
            })
            .is_ok()
    }

    fn help(name: &str) -> &'static str {
        Self::FAMILIES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map_or("", |(_, _, help)| help)
    }
}

impl Collector for ResourceCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(settings) = self.settings.get() else {
            return Vec::new();
        };
        let mut values = Vec::new();
        if let Some(limit) = settings.memory_limit {
            values.push((MEMORY_LIMIT, limit));
        }
        if let Some(space) = settings.snapshot_dir.as_deref().and_then(volume_space) {
            values.push((VOLUME_SIZE, space.size));
            values.push((VOLUME_FREE, space.free));
        }
        values
            .into_iter()
            .map(|(name, value)| {
                let mut gauge = Gauge::default();
                gauge.set_value(value as f64);
                let mut metric = Metric::default();
                metric.set_gauge(gauge);
                let mut family = MetricFamily::default();
                family.set_name(name.to_owned());
                family.set_help(Self::help(name).to_owned());
                family.set_field_type(MetricType::GAUGE);
                family.set_metric(vec![metric]);
                family
            })
            .collect()
    }
}

impl ResourceCollector {
    /// Reads the memory limit (`--memory-limit-bytes`, else the cgroup's), logs it, and
    /// exports it and the space of `snapshot_dir`'s volume (the process's collector is
    /// `ProcessMetrics::global().resources`). Called once at start-up.
    pub fn install(&self, memory_limit_flag: Option<u64>, snapshot_dir: Option<&Path>) {
        let limit = MemoryLimit::detect(memory_limit_flag);
        match &limit {
            MemoryLimit::Flag(bytes) => {
                tracing::info!(bytes, "memory limit from --memory-limit-bytes");
            }
            MemoryLimit::Cgroup { bytes, file } => {
                tracing::info!(bytes, file = %file.display(), "memory limit from the cgroup");
            }
            MemoryLimit::Unlimited => {
                tracing::info!("no memory limit found (memory_limit_bytes not exported)");
            }
        }
        self.configure(limit.bytes(), snapshot_dir.map(Path::to_path_buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_limits_parse_and_unlimited_ones_do_not() {
        assert_eq!(parse_cgroup_limit("4294967296\n"), Some(4_294_967_296));
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None);
        assert_eq!(parse_cgroup_limit(""), None);
        assert_eq!(parse_cgroup_limit("-1"), None);
        assert_eq!(parse_cgroup_limit("12k"), None);
    }

    #[test]
    fn limit_files_walk_each_hierarchy_up_to_its_root() {
        let root = Path::new("/cg");
        // cgroup v2 only.
        assert_eq!(
            limit_files("0::/kubepods/pod1/ctr\n", root),
            [
                "/cg/kubepods/pod1/ctr/memory.max",
                "/cg/kubepods/pod1/memory.max",
                "/cg/kubepods/memory.max",
                "/cg/memory.max",
            ]
            .map(PathBuf::from)
        );
        // In a cgroup namespace the process sits at the root.
        assert_eq!(
            limit_files("0::/\n", root),
            [PathBuf::from("/cg/memory.max")]
        );
        // Hybrid: v1 controllers (memory among them, here joined with another) beside an
        // empty v2 hierarchy.
        let hybrid = "9:name=systemd:/\n4:memory,hugetlb:/job/42\n3:cpuset:/\n0::/\n";
        assert_eq!(
            limit_files(hybrid, root),
            [
                "/cg/memory/job/42/memory.limit_in_bytes",
                "/cg/memory/job/memory.limit_in_bytes",
                "/cg/memory/memory.limit_in_bytes",
                "/cg/memory.max",
            ]
            .map(PathBuf::from)
        );
        // Lines that are not a membership are skipped; `..` cannot leave the root.
        assert_eq!(
            limit_files("garbage\n0::/../x\n", root),
            ["/cg/x/memory.max", "/cg/memory.max"].map(PathBuf::from)
        );
    }

    #[test]
    fn the_lowest_limit_on_the_way_to_the_root_counts() {
        let root = tempfile::tempdir().expect("tempdir");
        let write = |rel: &str, text: &str| {
            let path = root.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        };
        // v2: the container has no limit of its own, its pod has 2 GiB, the root none.
        write("kubepods/pod1/ctr/memory.max", "max\n");
        write("kubepods/pod1/memory.max", "2147483648\n");
        let files = limit_files("0::/kubepods/pod1/ctr\n", root.path());
        assert_eq!(
            lowest_cgroup_limit(&files),
            Some((2_147_483_648, root.path().join("kubepods/pod1/memory.max")))
        );
        // A tighter limit on the container wins.
        write("kubepods/pod1/ctr/memory.max", "1073741824\n");
        assert_eq!(
            lowest_cgroup_limit(&files).map(|(bytes, _)| bytes),
            Some(1_073_741_824)
        );
        // v1 with a host path that does not exist in the container: the mount root is the
        // container's own group.
        write("memory/memory.limit_in_bytes", "536870912\n");
        let files = limit_files("5:memory:/docker/abc\n", root.path());
        assert_eq!(
            lowest_cgroup_limit(&files),
            Some((
                536_870_912,
                root.path().join("memory/memory.limit_in_bytes")
            ))
        );
        // Unlimited everywhere.
        write("memory/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(lowest_cgroup_limit(&files), None);
    }

    #[test]
    fn the_flag_wins_over_the_cgroup_and_zero_means_no_limit() {
        assert_eq!(
            MemoryLimit::detect(Some(1 << 30)),
            MemoryLimit::Flag(1 << 30)
        );
        assert_eq!(MemoryLimit::detect(Some(1 << 30)).bytes(), Some(1 << 30));
        assert_eq!(MemoryLimit::detect(Some(0)), MemoryLimit::Unlimited);
        assert_eq!(MemoryLimit::Unlimited.bytes(), None);
    }

    fn gauges(collector: &ResourceCollector) -> Vec<(String, f64)> {
        collector
            .collect()
            .iter()
            .map(|f| {
                (
                    f.name().to_owned(),
                    f.get_metric()[0].get_gauge().get_value(),
                )
            })
            .collect()
    }

    #[test]
    fn nothing_is_exported_before_configure_and_the_first_configure_wins() {
        let collector = ResourceCollector::new();
        assert!(gauges(&collector).is_empty());
        assert!(collector.configure(Some(4096), None));
        assert_eq!(gauges(&collector), [(MEMORY_LIMIT.to_owned(), 4096.0)]);
        assert!(!collector.configure(Some(1), None));
        assert_eq!(gauges(&collector), [(MEMORY_LIMIT.to_owned(), 4096.0)]);
        // Unlimited and no snapshot directory: nothing.
        let collector = ResourceCollector::new();
        collector.configure(None, None);
        assert!(gauges(&collector).is_empty());
    }

    #[test]
    fn the_snapshot_volume_is_read_at_each_scrape() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stat = rustix::fs::statvfs(dir.path()).expect("statvfs");
        let size = (stat.f_blocks * stat.f_frsize) as f64;
        // A directory not created yet: the filesystem it would be created on.
        let collector = ResourceCollector::new();
        collector.configure(None, Some(dir.path().join("not/yet")));
        let values = gauges(&collector);
        let value = |name: &str| {
            values
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{name} in {values:?}"))
                .1
        };
        assert_eq!(value(VOLUME_SIZE), size);
        let free = value(VOLUME_FREE);
        assert!(free > 0.0 && free <= size, "free {free} of {size}");
        // Help and type as catalogued.
        for family in collector.collect() {
            assert_eq!(family.help(), ResourceCollector::help(family.name()));
            assert_eq!(family.get_field_type(), MetricType::GAUGE);
        }
    }

    #[test]
    fn a_relative_snapshot_dir_is_measured_from_the_working_directory() {
        let cwd = volume_space(Path::new(".")).expect("the working directory's volume");
        let relative = volume_space(Path::new("no-such-snapshot-dir")).expect("its parent's");
        assert_eq!(cwd.size, relative.size);
    }
}
