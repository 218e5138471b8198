//! The board: the status LED that shows the gateway's health across a room.
//!
//! One pattern per [`BoardState`], each a table of `(on_ms, off_ms)` steps played on repeat
//! (see [`pattern`] and `board/README.md`):
//!
//! | state        | pattern                                         |
//! |--------------|-------------------------------------------------|
//! | `Starting`   | slow blink: 500 on, 500 off                     |
//! | `Online`     | steady on                                       |
//! | `Degraded`   | double blink: 150 on, 150 off, 150 on, 1050 off |
//! | `Restarting` | fast blink: 100 on, 100 off                     |
//! | `Stopped`    | off                                             |
//!
//! The LED is any embedded-hal 1.0 `OutputPin`: the kernel's LED class ([`SysfsLed`], e.g. the
//! Pi's ACT LED), a GPIO line ([`GpioLed`]) or nothing ([`NoLed`]); `[led]` in the config
//! ([`LedConfig`]) picks one. [`spawn`] runs the blinker as a local task on the event loop;
//! [`LedHandle::stop`] shows `Stopped` and gives the LED back to the kernel.

mod blinker;
mod drivers;
pub mod pattern;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use crate::config::board::{Board, LedConfig, LedDriver};
pub use blinker::{run, Blinker, RETRY_AFTER_ERROR};
pub use drivers::{active_trigger, AnyLed, GpioLed, LedError, NoLed, SysfsLed};

use crate::protocol::HealthState;

/// What the LED shows: the gateway's health plus the two states around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoardState {
    /// Slow blink (500 ms on, 500 ms off): the process is up but not serving yet.
    Starting,
    /// Steady on: serving.
    Online,
    /// Fast blink (100 ms on, 100 ms off): the agent backend is restarting.
    Restarting,
    /// Double blink (150 on, 150 off, 150 on, 1050 off): serving, but something is wrong
    /// (storage, push, media full).
    Degraded,
    /// Off: the gateway has stopped.
    Stopped,
}

impl From<HealthState> for BoardState {
    fn from(health: HealthState) -> Self {
        match health {
            HealthState::Online => BoardState::Online,
            HealthState::Restarting => BoardState::Restarting,
            HealthState::Degraded => BoardState::Degraded,
        }
    }
}

/// Opens the LED `config` names. Never fails: when there is no usable LED the result is
/// [`AnyLed::None`], and exactly one log line says why (info when nothing was asked for or
/// `auto` found nothing, warn when a named LED cannot be opened).
pub fn open(config: &LedConfig) -> AnyLed {
    match config.driver {
        LedDriver::None => {
            info!("status LED: off ([led] driver = \"none\")");
            AnyLed::None(NoLed)
        }
        LedDriver::Auto => {
            match SysfsLed::open_with_fallback(&config.sysfs_path, config.inverted) {
                Ok(led) => {
                    info!("status LED: {}", led.dir().display());
                    AnyLed::Sysfs(led)
                }
                Err(e) => {
                    info!("status LED: none usable, not showing status ({e})");
                    AnyLed::None(NoLed)
                }
            }
        }
        LedDriver::Sysfs => match SysfsLed::open_with_fallback(&config.sysfs_path, config.inverted)
        {
            Ok(led) => {
                info!("status LED: {}", led.dir().display());
                AnyLed::Sysfs(led)
            }
            Err(e) => {
                warn!("status LED: cannot use it, not showing status: {e}");
                AnyLed::None(NoLed)
            }
        },
        LedDriver::Gpio => {
            let Some(line) = config.gpio_line else {
                warn!("status LED: led.driver = \"gpio\" needs led.gpio_line; not showing status");
                return AnyLed::None(NoLed);
            };
            match GpioLed::open(&config.gpio_chip, line, config.active_low) {
                Ok(led) => {
                    info!("status LED: {} line {line}", config.gpio_chip.display());
                    AnyLed::Gpio(led)
                }
                Err(e) => {
                    warn!("status LED: cannot use it, not showing status: {e}");
                    AnyLed::None(NoLed)
                }
            }
        }
    }
}

/// The running status-LED task.
#[derive(Debug)]
pub struct LedHandle {
    control: mpsc::UnboundedSender<BoardState>,
    task: JoinHandle<()>,
    has_led: bool,
}

/// Opens the LED `config` names and starts the blinker on the current `LocalSet` (so this must
/// be called inside one). It shows `initial` (typically [`BoardState::Starting`]) until `health`
/// next changes or [`LedHandle::show`] says otherwise, then follows both; the value `health`
/// holds now counts as seen. Dropping the handle stops the task like [`LedHandle::stop`]
/// (without waiting for it).
pub fn spawn(
    config: &LedConfig,
    initial: BoardState,
    health: watch::Receiver<HealthState>,
) -> LedHandle {
    let led = open(config);
    let has_led = !led.is_none();
    let (control, control_rx) = mpsc::unbounded_channel();
    let task = tokio::task::spawn_local(async move {
        let mut led = run(led, initial, health, control_rx).await;
        if let Err(e) = led.restore() {
            warn!("status LED: cannot give it back to the kernel: {e}");
        }
    });
    LedHandle {
        control,
        task,
        has_led,
    }
}

impl LedHandle {
    /// Shows `state` now (e.g. `Online` once the listener is up, when health has not changed
    /// since [`spawn`]); the next health change overrides it. `Stopped` ends the task as
    /// [`stop`](Self::stop) does, without waiting.
    pub fn show(&self, state: BoardState) {
        // Fails only if the task has ended, when there is nothing left to show.
        let _ = self.control.send(state);
    }

    /// Whether a real LED is driven (not [`NoLed`]).
    pub fn has_led(&self) -> bool {
        self.has_led
    }

    /// Shows `Stopped` (off), gives the LED back to the kernel (its saved trigger) and waits
    /// for the task to end.
    pub async fn stop(self) {
        let _ = self.control.send(BoardState::Stopped);
        if let Err(e) = self.task.await {
            warn!("status LED task failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_maps_to_board_states() {
        assert_eq!(BoardState::from(HealthState::Online), BoardState::Online);
        assert_eq!(
            BoardState::from(HealthState::Restarting),
            BoardState::Restarting
        );
        assert_eq!(
            BoardState::from(HealthState::Degraded),
            BoardState::Degraded
        );
    }

    #[test]
    fn auto_uses_sysfs_when_present_else_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = LedConfig {
            sysfs_path: tmp.path().join("ACT"),
            ..LedConfig::default()
        };
        assert!(open(&config).is_none());
        config.driver = LedDriver::Sysfs;
        assert!(open(&config).is_none(), "a named but missing LED is no LED");
        let led0 = tmp.path().join("led0");
        std::fs::create_dir(&led0).unwrap();
        std::fs::write(led0.join("trigger"), "none [mmc0] timer heartbeat").unwrap();
        std::fs::write(led0.join("brightness"), "0").unwrap();
        config.driver = LedDriver::Auto;
        match open(&config) {
            AnyLed::Sysfs(led) => assert_eq!(led.dir(), led0),
            other => panic!("expected the led0 fallback, got {other:?}"),
        }
        // Dropped: the trigger is back.
        assert_eq!(
            std::fs::read_to_string(led0.join("trigger")).unwrap(),
            "mmc0"
        );
        config.driver = LedDriver::None;
        assert!(open(&config).is_none());
    }

    #[test]
    fn a_missing_gpio_chip_is_no_led() {
        let tmp = tempfile::tempdir().unwrap();
        let config = LedConfig {
            driver: LedDriver::Gpio,
            gpio_chip: tmp.path().join("gpiochip0"),
            gpio_line: Some(17),
            ..LedConfig::default()
        };
        assert!(open(&config).is_none());
    }
}
