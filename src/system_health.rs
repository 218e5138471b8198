//! The box's own health, read from the system: CPU temperature, memory, load, uptime, this
//! process's memory, the data disk's space, the bytes written to the card holding the data dir
//! since boot and its wear where the card reports it, the addresses, the time and timezone.
//!
//! Every value is what the kernel says or nothing: a board (or a VM, or a container) that does
//! not expose a value leaves it `None`, and the page says so instead of guessing. Each file is
//! read with a size cap ([`READ_CAP`]) and parsed by a pure function, tested below on sample
//! texts from a Raspberry Pi and a PC.

use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The most read of any one file: every file read here is a few hundred bytes on a Pi
/// (`/proc/meminfo` about 1.5 KiB); the cap keeps a strange kernel from costing memory.
pub const READ_CAP: u64 = 16 << 10;
/// A temperature outside this range (in °C) is a sensor's placeholder, not a reading.
const SANE_CELSIUS: std::ops::RangeInclusive<f64> = -40.0..=150.0;
/// Block devices count in 512-byte sectors, whatever the device's own sector size.
const SECTOR_BYTES: u64 = 512;

/// What the system reports, each value `None` where this machine does not expose it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SystemHealth {
    /// The CPU's (or the SoC's) temperature in °C.
    pub cpu_celsius: Option<f64>,
    pub mem_total_bytes: Option<u64>,
    pub mem_available_bytes: Option<u64>,
    /// The 1, 5 and 15 minute load averages.
    pub load: Option<[f64; 3]>,
    pub system_uptime_secs: Option<u64>,
    /// This process's resident memory.
    pub rss_bytes: Option<u64>,
    pub disk_free_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    /// The whole block device holding the data dir (`mmcblk0`), when it is one.
    pub disk_device: Option<String>,
    /// Bytes written to that device since boot.
    pub disk_written_bytes: Option<u64>,
    /// eMMC/SD wear estimates (`life_time`: two estimates 1–11 in tenths of the life used;
    /// `pre_eol_info`: 1 normal, 2 warning, 3 urgent), where the card reports them.
    pub wear_life: Option<[u8; 2]>,
    pub wear_pre_eol: Option<u8>,
    /// `eth0 192.168.1.20`, loopback left out.
    pub addresses: Vec<String>,
    /// The local time (`2026-03-01 14:05:09 +01:00`) and the timezone's name where set.
    pub time: String,
    pub timezone: Option<String>,
    /// The clock's year, for "the clock is not set" (a Pi without a network starts in 1970).
    pub year: i32,
}

/// Reads everything. It reads about fifteen small files, asks the data disk's filesystem for
/// its space and the kernel for the addresses: a failing SD card can hold `statvfs` for
/// seconds, so the caller runs this on a blocking thread, never on the event loop.
pub fn read(data_dir: &Path) -> SystemHealth {
    let meminfo = read_capped("/proc/meminfo").map(|t| parse_meminfo(&t));
    let (mem_total_bytes, mem_available_bytes) = meminfo.unwrap_or_default();
    let disk = disk_of(data_dir);
    let space = crate::disk::space(data_dir).ok();
    let now = chrono::Local::now();
    SystemHealth {
        cpu_celsius: cpu_celsius(Path::new("/sys/class/thermal")),
        mem_total_bytes,
        mem_available_bytes,
        load: read_capped("/proc/loadavg").and_then(|t| parse_loadavg(&t)),
        system_uptime_secs: read_capped("/proc/uptime").and_then(|t| parse_uptime(&t)),
        rss_bytes: read_capped("/proc/self/status").and_then(|t| parse_vm_rss(&t)),
        disk_free_bytes: space.map(|s| s.free),
        disk_total_bytes: space.map(|s| s.total),
        disk_device: disk
            .as_ref()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned()),
        disk_written_bytes: disk
            .as_ref()
            .and_then(|d| read_capped(d.join("stat")))
            .and_then(|t| parse_block_written(&t)),
        wear_life: disk
            .as_ref()
            .and_then(|d| read_capped(d.join("device/life_time")))
            .and_then(|t| parse_life_time(&t)),
        wear_pre_eol: disk
            .as_ref()
            .and_then(|d| read_capped(d.join("device/pre_eol_info")))
            .and_then(|t| parse_hex_byte(t.trim())),
        addresses: addresses(),
        time: now.format("%Y-%m-%d %H:%M:%S %:z").to_string(),
        timezone: timezone(),
        year: chrono::Datelike::year(&now),
    }
}

/// Samples kept per series of the Status page's day of figures: 24 hours at one every
/// [`SAMPLE_EVERY`].
pub const HISTORY_SAMPLES: usize = 288;
/// How often the day of figures takes a sample.
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// [`SAMPLE_EVERY`], or in a debug build `IRIS_GATEWAY_HEALTH_SAMPLE_MS`: tests see several
/// samples without waiting on a five-minute clock; the release binary has no such door.
pub fn sample_every() -> std::time::Duration {
    let hook = cfg!(debug_assertions)
        .then(|| std::env::var("IRIS_GATEWAY_HEALTH_SAMPLE_MS").ok())
        .flatten()
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|ms| *ms > 0);
    hook.map_or(SAMPLE_EVERY, std::time::Duration::from_millis)
}

/// The figures one sample of the day keeps: four small files, no `statvfs`, nothing written.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub cpu_celsius: Option<f64>,
    /// `MemTotal - MemAvailable`.
    pub mem_used_bytes: Option<u64>,
    /// The 1-minute load average.
    pub load: Option<f64>,
    /// Bytes written to the data dir's device since boot (a counter: the day plots its steps).
    pub disk_written_bytes: Option<u64>,
}

/// Reads one [`Sample`]; like [`read`], on a blocking thread (a failing card can hold a read).
pub fn read_sample(data_dir: &Path) -> Sample {
    let (total, available) = read_capped("/proc/meminfo")
        .map(|t| parse_meminfo(&t))
        .unwrap_or_default();
    Sample {
        cpu_celsius: cpu_celsius(Path::new("/sys/class/thermal")),
        mem_used_bytes: total.zip(available).map(|(t, a)| t.saturating_sub(a)),
        load: read_capped("/proc/loadavg")
            .and_then(|t| parse_loadavg(&t))
            .map(|[one, _, _]| one),
        disk_written_bytes: disk_of(data_dir)
            .and_then(|d| read_capped(d.join("stat")))
            .and_then(|t| parse_block_written(&t)),
    }
}

/// One series of the day: the last [`HISTORY_SAMPLES`] values in a fixed array (no allocation
/// after creation, so a month of uptime costs what the first day did), `NaN` where the machine
/// reported nothing at that sample.
#[derive(Debug, Clone)]
pub struct Ring {
    values: [f32; HISTORY_SAMPLES],
    /// Where the next value goes (the oldest, once full).
    next: usize,
    len: usize,
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            values: [f32::NAN; HISTORY_SAMPLES],
            next: 0,
            len: 0,
        }
    }
}

impl Ring {
    fn push(&mut self, value: Option<f64>) {
        self.values[self.next] = value.map_or(f32::NAN, |v| v as f32);
        self.next = (self.next + 1) % HISTORY_SAMPLES;
        self.len = (self.len + 1).min(HISTORY_SAMPLES);
    }

    /// The samples, oldest first: `None` where nothing was reported.
    pub fn values(&self) -> impl Iterator<Item = Option<f32>> + '_ {
        let start = (self.next + HISTORY_SAMPLES - self.len) % HISTORY_SAMPLES;
        (0..self.len).map(move |i| {
            let v = self.values[(start + i) % HISTORY_SAMPLES];
            v.is_finite().then_some(v)
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Which of the day's series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    Temperature,
    Memory,
    Load,
    /// Bytes written to the card between one sample and the one before.
    Written,
}

impl Series {
    pub const ALL: [Series; 4] = [
        Series::Temperature,
        Series::Memory,
        Series::Load,
        Series::Written,
    ];
}

/// The Status page's last 24 hours of figures, kept in memory only: a record on the card every
/// five minutes would cost the card the wear the page is there to watch.
#[derive(Debug, Clone, Default)]
pub struct History {
    rings: [Ring; 4],
    /// The write counter at the last sample (or the baseline), for the next step.
    last_written: Option<u64>,
}

impl History {
    /// The write counter at start, so the first sample already has a step to show.
    pub fn baseline(&mut self, sample: &Sample) {
        self.last_written = sample.disk_written_bytes;
    }

    pub fn record(&mut self, sample: &Sample) {
        // A counter that went back (another device behind the path) is no step.
        let step = sample
            .disk_written_bytes
            .zip(self.last_written)
            .and_then(|(now, before)| now.checked_sub(before));
        self.last_written = sample.disk_written_bytes;
        let [temp, memory, load, written] = &mut self.rings;
        temp.push(sample.cpu_celsius);
        memory.push(sample.mem_used_bytes.map(|b| b as f64));
        load.push(sample.load);
        written.push(step.map(|b| b as f64));
    }

    pub fn series(&self, which: Series) -> &Ring {
        &self.rings[which as usize]
    }

    /// How many samples were taken (at most [`HISTORY_SAMPLES`]).
    pub fn samples(&self) -> usize {
        self.rings[0].len()
    }
}

/// A file's text, at most [`READ_CAP`] bytes of it; `None` if it cannot be read.
fn read_capped(path: impl AsRef<Path>) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(READ_CAP).read_to_string(&mut text).ok()?;
    Some(text)
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// The three load averages of `/proc/loadavg`.
pub fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut it = text.split_whitespace().map(|w| w.parse::<f64>().ok());
    let load = [it.next()??, it.next()??, it.next()??];
    load.iter()
        .all(|l| l.is_finite() && *l >= 0.0)
        .then_some(load)
}

/// Whole seconds since boot, from `/proc/uptime`.
pub fn parse_uptime(text: &str) -> Option<u64> {
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then_some(secs as u64)
}

/// `VmRSS` of `/proc/self/status`, in bytes.
pub fn parse_vm_rss(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let kib: u64 = l
            .strip_prefix("VmRSS:")?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    })
}

/// A thermal zone's `temp` (millidegrees Celsius) in °C, if it is a sane reading.
pub fn parse_millidegrees(text: &str) -> Option<f64> {
    let milli: i64 = text.trim().parse().ok()?;
    let c = milli as f64 / 1000.0;
    SANE_CELSIUS.contains(&c).then_some(c)
}

/// Bytes written since boot, from a block device's `stat` (the seventh field counts sectors
/// written; Documentation/block/stat.rst).
pub fn parse_block_written(text: &str) -> Option<u64> {
    let sectors: u64 = text.split_whitespace().nth(6)?.parse().ok()?;
    sectors.checked_mul(SECTOR_BYTES)
}

/// `0x01 0x02` (an eMMC/SD `life_time`): the two estimates of the life used.
pub fn parse_life_time(text: &str) -> Option<[u8; 2]> {
    let mut it = text.split_whitespace().map(parse_hex_byte);
    let life = [it.next()??, it.next()??];
    // 0 means "not defined" in the standard: the card does not really report it.
    life.iter().all(|v| (1..=11).contains(v)).then_some(life)
}

/// `0x03` or `3` as a byte; 0 (undefined) is none.
pub fn parse_hex_byte(word: &str) -> Option<u8> {
    let v = match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
        Some(hex) => u8::from_str_radix(hex, 16).ok()?,
        None => word.parse().ok()?,
    };
    (v != 0).then_some(v)
}

/// A device number's major and minor, as glibc's `gnu_dev_major`/`gnu_dev_minor` encode them.
pub fn major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    (major, minor)
}

/// The sysfs directory of the whole disk holding `dir` (`/sys/devices/…/block/mmcblk0`):
/// `/sys/dev/block/MAJ:MIN` names the partition, whose parent is the disk. `None` on a
/// filesystem without a block device (tmpfs, overlay, NFS: major 0).
fn disk_of(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let (major, minor) = major_minor(std::fs::metadata(dir).ok()?.dev());
    if major == 0 {
        return None;
    }
    let node = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    if node.join("partition").exists() {
        node.parent().map(Path::to_path_buf)
    } else {
        Some(node)
    }
}

/// The CPU's temperature: the zone whose `type` names the CPU or SoC (`cpu-thermal` on a Pi,
/// `x86_pkg_temp` on a PC), else the first zone with a sane reading.
fn cpu_celsius(thermal: &Path) -> Option<f64> {
    let mut zones: Vec<PathBuf> = std::fs::read_dir(thermal)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("thermal_zone"))
        .map(|e| e.path())
        .collect();
    zones.sort();
    let reading = |z: &PathBuf| read_capped(z.join("temp")).and_then(|t| parse_millidegrees(&t));
    let is_cpu = |z: &PathBuf| {
        read_capped(z.join("type")).is_some_and(|t| {
            let t = t.to_ascii_lowercase();
            t.contains("cpu") || t.contains("soc") || t.contains("pkg")
        })
    };
    zones
        .iter()
        .filter(|z| is_cpu(z))
        .find_map(reading)
        .or_else(|| zones.iter().find_map(reading))
}

/// Every address but loopback, with its interface's name.
fn addresses() -> Vec<String> {
    let Ok(ifaces) = if_addrs::get_if_addrs() else {
        return Vec::new();
    };
    ifaces
        .iter()
        .filter(|i| !i.is_loopback())
        .map(|i| match i.ip() {
            IpAddr::V4(ip) => format!("{} {ip}", i.name),
            IpAddr::V6(ip) => format!("{} {ip}", i.name),
        })
        .collect()
}

/// The timezone's name: `TZ`, else Debian's `/etc/timezone`, else where `/etc/localtime`
/// points (`…/zoneinfo/Europe/Paris`).
fn timezone() -> Option<String> {
    if let Some(tz) = std::env::var("TZ").ok().filter(|t| !t.is_empty()) {
        return Some(tz.trim_start_matches(':').to_owned());
    }
    if let Some(tz) = read_capped("/etc/timezone") {
        let tz = tz.trim();
        if !tz.is_empty() {
            return Some(tz.to_owned());
        }
    }
    let target = std::fs::read_link("/etc/localtime").ok()?;
    let target = target.to_string_lossy();
    target
        .split_once("zoneinfo/")
        .map(|(_, name)| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO_PI: &str = "MemTotal:         944268 kB\nMemFree:          500000 kB\n\
                              MemAvailable:     712340 kB\nBuffers:           20000 kB\n";

    #[test]
    fn the_day_wraps_at_its_bound_and_keeps_its_size() {
        let mut day = History::default();
        let size = std::mem::size_of_val(&day);
        let sample = |i: u64| Sample {
            cpu_celsius: Some(i as f64),
            mem_used_bytes: Some(i),
            load: i.is_multiple_of(2).then_some(0.5),
            disk_written_bytes: Some(i * 1000),
        };
        day.baseline(&sample(0));
        for i in 1..=(HISTORY_SAMPLES as u64 + 10) {
            day.record(&sample(i));
        }
        assert_eq!(day.samples(), HISTORY_SAMPLES);
        assert_eq!(std::mem::size_of_val(&day), size);
        let temps: Vec<_> = day.series(Series::Temperature).values().collect();
        assert_eq!(temps.len(), HISTORY_SAMPLES);
        // The ten oldest went: the day starts at sample 11 and ends at the last one.
        assert_eq!(temps[0], Some(11.0));
        assert_eq!(
            temps[HISTORY_SAMPLES - 1],
            Some(HISTORY_SAMPLES as f32 + 10.0)
        );
        // What a sample did not report stays a gap, not a zero.
        let load: Vec<_> = day.series(Series::Load).values().collect();
        assert_eq!(
            load.iter().filter(|v| v.is_none()).count(),
            HISTORY_SAMPLES / 2
        );
        // The card's series is the step since the sample before.
        assert!(day
            .series(Series::Written)
            .values()
            .all(|v| v == Some(1000.0)));
    }

    #[test]
    fn a_write_counter_without_a_baseline_or_going_back_is_no_step() {
        let mut day = History::default();
        let written = |b| Sample {
            disk_written_bytes: Some(b),
            ..Sample::default()
        };
        day.record(&written(500));
        day.record(&written(200));
        day.record(&written(700));
        let steps: Vec<_> = day.series(Series::Written).values().collect();
        assert_eq!(steps, [None, None, Some(500.0)]);
        assert!(History::default().series(Series::Memory).is_empty());
    }

    #[test]
    fn meminfo_gives_total_and_available() {
        assert_eq!(
            parse_meminfo(MEMINFO_PI),
            (Some(944_268 * 1024), Some(712_340 * 1024))
        );
        // An old kernel without MemAvailable.
        assert_eq!(
            parse_meminfo("MemTotal: 1000 kB\nMemFree: 10 kB\n"),
            (Some(1_024_000), None)
        );
        assert_eq!(parse_meminfo("garbage"), (None, None));
    }

    #[test]
    fn loadavg_uptime_and_rss_parse() {
        assert_eq!(
            parse_loadavg("0.52 0.58 0.59 1/189 12345\n"),
            Some([0.52, 0.58, 0.59])
        );
        assert_eq!(parse_loadavg("0.52 x 0.59"), None);
        assert_eq!(parse_loadavg("0.52"), None);
        assert_eq!(parse_uptime("350735.47 234388.90\n"), Some(350_735));
        assert_eq!(parse_uptime("-1 0"), None);
        assert_eq!(
            parse_vm_rss("Name:\tiris-gateway\nVmPeak:\t  9000 kB\nVmRSS:\t    5432 kB\n"),
            Some(5432 * 1024)
        );
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }

    #[test]
    fn temperatures_are_millidegrees_and_placeholders_are_not_readings() {
        assert_eq!(parse_millidegrees("48312\n"), Some(48.312));
        assert_eq!(parse_millidegrees("-5000"), Some(-5.0));
        // What some sensors report when they have no reading.
        assert_eq!(parse_millidegrees("-273150"), None);
        assert_eq!(parse_millidegrees("200000"), None);
        assert_eq!(parse_millidegrees("n/a"), None);
    }

    #[test]
    fn block_stat_counts_sectors_written() {
        let stat = "    4954     1627   363498     3455     2207     2958   103944    52711        0     6400    56167";
        assert_eq!(parse_block_written(stat), Some(103_944 * 512));
        assert_eq!(parse_block_written("1 2 3"), None);
    }

    #[test]
    fn wear_is_read_only_where_defined() {
        assert_eq!(parse_life_time("0x01 0x02\n"), Some([1, 2]));
        assert_eq!(parse_life_time("0x00 0x00\n"), None, "undefined");
        assert_eq!(parse_life_time("0x01"), None);
        assert_eq!(parse_hex_byte("0x03"), Some(3));
        assert_eq!(parse_hex_byte("0x00"), None);
        assert_eq!(parse_hex_byte("2"), Some(2));
        assert_eq!(parse_hex_byte("zz"), None);
    }

    #[test]
    fn device_numbers_split_as_glibc_does() {
        // mmcblk0p2 is 179:2; a large minor uses the high bits.
        assert_eq!(major_minor((179 << 8) | 2), (179, 2));
        let makedev = |ma: u64, mi: u64| {
            (mi & 0xff) | ((ma & 0xfff) << 8) | ((mi & !0xff) << 12) | ((ma & !0xfff) << 32)
        };
        assert_eq!(major_minor(makedev(0x1008, 0x12345)), (0x1008, 0x12345));
        assert_eq!(major_minor(0x2e), (0, 0x2e));
    }

    #[test]
    fn this_machine_reads_without_inventing() {
        let h = read(Path::new("/"));
        // Linux always has these; what a board lacks stays None.
        assert!(h.mem_total_bytes.is_some_and(|m| m > 0), "{h:?}");
        assert!(h.system_uptime_secs.is_some(), "{h:?}");
        if let Some(c) = h.cpu_celsius {
            assert!(SANE_CELSIUS.contains(&c), "{h:?}");
        }
        assert!(h.year >= 1970, "{h:?}");
    }
}
