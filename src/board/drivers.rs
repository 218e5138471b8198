//! LED drivers behind embedded-hal 1.0's `OutputPin`: `set_high` lights the LED, `set_low`
//! darkens it, whatever the wiring (polarity is each driver's business).
//!
//! Every write is one tiny synchronous write (a sysfs attribute or a GPIO ioctl) done on the
//! event loop: microseconds, never a wait on a device, so there is nothing to offload.

use std::convert::Infallible;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use embedded_hal::digital::{ErrorKind, ErrorType, OutputPin};
use linux_embedded_hal::gpio_cdev::{Chip, LineRequestFlags};
use linux_embedded_hal::CdevPin;

/// What went wrong with an LED.
#[derive(Debug, thiserror::Error)]
pub enum LedError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no LED class directory (tried {})", path.display(), tried)]
    NotFound { path: PathBuf, tried: String },
    #[error("GPIO {} line {line}: {source}", chip.display())]
    Gpio {
        chip: PathBuf,
        line: u32,
        source: linux_embedded_hal::gpio_cdev::errors::Error,
    },
    #[error("GPIO write: {0}")]
    GpioWrite(#[from] linux_embedded_hal::CdevPinError),
}

impl embedded_hal::digital::Error for LedError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Other
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LedError + '_ {
    move |source| LedError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes a whole sysfs attribute. Opened each time (never created), so an LED that goes away
/// and comes back (a module reload) works again on the next write.
fn write_attr(path: &Path, value: &str) -> Result<(), LedError> {
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(io_err(path))
}

/// The active entry of an LED `trigger` file: the bracketed one (`none [mmc0] timer` → `mmc0`).
pub fn active_trigger(content: &str) -> Option<&str> {
    content
        .split_whitespace()
        .find_map(|t| t.strip_prefix('[')?.strip_suffix(']'))
}

/// A kernel LED-class LED (`/sys/class/leds/NAME`), e.g. the Pi's ACT LED.
///
/// Opening it saves the active trigger and sets the trigger to `none`, so the kernel stops
/// driving it; `restore` (or drop) puts the saved trigger back (and, if that was `none`, the
/// brightness it had).
#[derive(Debug)]
pub struct SysfsLed {
    dir: PathBuf,
    inverted: bool,
    saved_trigger: Option<String>,
    saved_brightness: Option<String>,
    restored: bool,
}

impl SysfsLed {
    /// The ACT LED's directory on current kernels.
    pub const DEFAULT_PATH: &'static str = "/sys/class/leds/ACT";

    /// Takes over the LED at exactly `dir`. `inverted` swaps the brightness values written.
    pub fn open(dir: &Path, inverted: bool) -> Result<SysfsLed, LedError> {
        let trigger_path = dir.join("trigger");
        let brightness_path = dir.join("brightness");
        let trigger = std::fs::read_to_string(&trigger_path).map_err(io_err(&trigger_path))?;
        let saved_brightness = std::fs::read_to_string(&brightness_path)
            .map_err(io_err(&brightness_path))?
            .trim()
            .to_owned();
        // Writable? Checked before the trigger is touched, so a read-only LED is left alone.
        OpenOptions::new()
            .write(true)
            .open(&brightness_path)
            .map_err(io_err(&brightness_path))?;
        write_attr(&trigger_path, "none")?;
        Ok(SysfsLed {
            dir: dir.to_owned(),
            inverted,
            saved_trigger: active_trigger(&trigger).map(str::to_owned),
            saved_brightness: Some(saved_brightness),
            restored: false,
        })
    }

    /// Takes over the LED at `dir`, or, when `dir` ends in `ACT` and is missing, its older
    /// kernels' name `led0` next to it.
    pub fn open_with_fallback(dir: &Path, inverted: bool) -> Result<SysfsLed, LedError> {
        let mut candidates = vec![dir.to_owned()];
        if dir.file_name().is_some_and(|n| n == "ACT") {
            candidates.push(dir.with_file_name("led0"));
        }
        let mut last_err = None;
        for candidate in &candidates {
            if !candidate.join("trigger").exists() {
                continue;
            }
            match SysfsLed::open(candidate, inverted) {
                Ok(led) => return Ok(led),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| LedError::NotFound {
            path: dir.to_owned(),
            tried: candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }))
    }

    /// The LED-class directory in use.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The trigger that was active when the LED was taken over.
    pub fn saved_trigger(&self) -> Option<&str> {
        self.saved_trigger.as_deref()
    }

    fn set(&mut self, on: bool) -> Result<(), LedError> {
        let value = if on != self.inverted { "1" } else { "0" };
        write_attr(&self.dir.join("brightness"), value)
    }

    /// Gives the LED back to the kernel: writes the saved trigger back. Done once; drop does it
    /// if this was not called.
    pub fn restore(&mut self) -> Result<(), LedError> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        if let Some(trigger) = &self.saved_trigger {
            write_attr(&self.dir.join("trigger"), trigger)?;
            if trigger == "none" {
                if let Some(b) = &self.saved_brightness {
                    write_attr(&self.dir.join("brightness"), b)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for SysfsLed {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::debug!("status LED: cannot restore its trigger: {e}");
        }
    }
}

impl ErrorType for SysfsLed {
    type Error = LedError;
}

impl OutputPin for SysfsLed {
    fn set_low(&mut self) -> Result<(), LedError> {
        self.set(false)
    }

    fn set_high(&mut self) -> Result<(), LedError> {
        self.set(true)
    }
}

/// An LED on a GPIO line, through the GPIO character device (linux-embedded-hal's `CdevPin`).
///
/// The line is requested as a plain output and polarity is applied here (`active_low`), so the
/// kernel's and linux-embedded-hal's own active-low handling never both apply. The line is
/// released (and keeps its last level: off after `Stopped`) when this is dropped.
pub struct GpioLed {
    pin: CdevPin,
    active_low: bool,
}

impl GpioLed {
    /// Requests `line` on `chip` as an output, starting dark.
    pub fn open(chip: &Path, line: u32, active_low: bool) -> Result<GpioLed, LedError> {
        let gpio_err = |source| LedError::Gpio {
            chip: chip.to_owned(),
            line,
            source,
        };
        let off = u8::from(active_low);
        let handle = Chip::new(chip)
            .and_then(|mut c| c.get_line(line))
            .and_then(|l| l.request(LineRequestFlags::OUTPUT, off, "iris-gateway"))
            .map_err(gpio_err)?;
        let pin = CdevPin::new(handle).map_err(gpio_err)?;
        Ok(GpioLed { pin, active_low })
    }
}

impl std::fmt::Debug for GpioLed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpioLed")
            .field("line", &self.pin.0.line().offset())
            .field("active_low", &self.active_low)
            .finish()
    }
}

impl ErrorType for GpioLed {
    type Error = LedError;
}

impl OutputPin for GpioLed {
    fn set_low(&mut self) -> Result<(), LedError> {
        let r = if self.active_low {
            self.pin.set_high()
        } else {
            self.pin.set_low()
        };
        Ok(r?)
    }

    fn set_high(&mut self) -> Result<(), LedError> {
        let r = if self.active_low {
            self.pin.set_low()
        } else {
            self.pin.set_high()
        };
        Ok(r?)
    }
}

/// No LED: every write succeeds and does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoLed;

impl ErrorType for NoLed {
    type Error = Infallible;
}

impl OutputPin for NoLed {
    fn set_low(&mut self) -> Result<(), Infallible> {
        Ok(())
    }

    fn set_high(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}

/// Whichever driver the config chose, as one type.
#[derive(Debug)]
pub enum AnyLed {
    Sysfs(SysfsLed),
    Gpio(GpioLed),
    None(NoLed),
}

impl AnyLed {
    /// Gives the LED back (the sysfs trigger); nothing to do for the others.
    pub fn restore(&mut self) -> Result<(), LedError> {
        match self {
            AnyLed::Sysfs(led) => led.restore(),
            AnyLed::Gpio(_) | AnyLed::None(_) => Ok(()),
        }
    }

    pub fn is_none(&self) -> bool {
        matches!(self, AnyLed::None(_))
    }
}

impl ErrorType for AnyLed {
    type Error = LedError;
}

impl OutputPin for AnyLed {
    fn set_low(&mut self) -> Result<(), LedError> {
        match self {
            AnyLed::Sysfs(led) => led.set_low(),
            AnyLed::Gpio(led) => led.set_low(),
            AnyLed::None(_) => Ok(()),
        }
    }

    fn set_high(&mut self) -> Result<(), LedError> {
        match self {
            AnyLed::Sysfs(led) => led.set_high(),
            AnyLed::Gpio(led) => led.set_high(),
            AnyLed::None(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake LED-class directory like the Pi's, in a temp dir.
    fn fake_led(root: &Path, name: &str) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("trigger"), "none [mmc0] timer heartbeat\n").unwrap();
        std::fs::write(dir.join("brightness"), "0\n").unwrap();
        dir
    }

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn parses_the_active_trigger() {
        assert_eq!(
            active_trigger("none [mmc0] timer heartbeat\n"),
            Some("mmc0")
        );
        assert_eq!(active_trigger("[none] mmc0"), Some("none"));
        assert_eq!(active_trigger("none mmc0"), None);
    }

    #[test]
    fn takes_over_writes_and_restores() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = fake_led(tmp.path(), "ACT");
        let mut led = SysfsLed::open(&dir, false).unwrap();
        assert_eq!(led.saved_trigger(), Some("mmc0"));
        assert_eq!(read(dir.join("trigger")), "none");
        led.set_high().unwrap();
        assert_eq!(read(dir.join("brightness")), "1");
        led.set_low().unwrap();
        assert_eq!(read(dir.join("brightness")), "0");
        led.restore().unwrap();
        assert_eq!(read(dir.join("trigger")), "mmc0");
        // Restored once: dropping does not write again.
        std::fs::write(dir.join("trigger"), "[timer]").unwrap();
        drop(led);
        assert_eq!(read(dir.join("trigger")), "[timer]");
    }

    #[test]
    fn inverted_and_restored_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = fake_led(tmp.path(), "ACT");
        let mut led = SysfsLed::open(&dir, true).unwrap();
        led.set_high().unwrap();
        assert_eq!(read(dir.join("brightness")), "0");
        led.set_low().unwrap();
        assert_eq!(read(dir.join("brightness")), "1");
        drop(led);
        assert_eq!(read(dir.join("trigger")), "mmc0");
    }

    #[test]
    fn falls_back_to_led0_and_reports_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let act = tmp.path().join("ACT");
        let e = SysfsLed::open_with_fallback(&act, false).unwrap_err();
        assert!(matches!(e, LedError::NotFound { .. }), "{e}");
        assert!(SysfsLed::open(&act, false).is_err());
        let led0 = fake_led(tmp.path(), "led0");
        let led = SysfsLed::open_with_fallback(&act, false).unwrap();
        assert_eq!(led.dir(), led0);
    }

    #[test]
    fn a_vanished_led_errors_then_recovers() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = fake_led(tmp.path(), "ACT");
        let mut led = SysfsLed::open(&dir, false).unwrap();
        std::fs::remove_file(dir.join("brightness")).unwrap();
        assert!(led.set_high().is_err());
        assert!(!dir.join("brightness").exists(), "never creates files");
        std::fs::write(dir.join("brightness"), "0").unwrap();
        led.set_high().unwrap();
        assert_eq!(read(dir.join("brightness")), "1");
    }

    #[test]
    fn a_missing_gpio_chip_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(GpioLed::open(&tmp.path().join("gpiochip9"), 3, false).is_err());
    }
}
