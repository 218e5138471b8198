//! The `[led]` config section and the per-board defaults embedded from `board/*.toml`.
//!
//! Precedence, per key: what `[led]` says > the named `board`'s file > the built-in default.
//! Every key is optional; an unknown key or value is a config error, as everywhere else.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which driver shows the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LedDriver {
    /// The sysfs LED at `sysfs_path` (or its `led0` sibling) if present and writable, else none.
    Auto,
    /// A kernel LED-class LED (`/sys/class/leds/NAME`).
    Sysfs,
    /// A GPIO line through the character device (`gpio_chip` + `gpio_line`).
    Gpio,
    /// No LED.
    None,
}

/// Boards with defaults in `board/*.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Board {
    #[serde(rename = "pi-zero-2w")]
    PiZero2W,
    #[serde(rename = "pi3")]
    Pi3,
    #[serde(rename = "pi4")]
    Pi4,
    #[serde(rename = "pi5")]
    Pi5,
}

impl Board {
    pub const ALL: [Board; 4] = [Board::PiZero2W, Board::Pi3, Board::Pi4, Board::Pi5];

    /// The name used in config and for the file under `board/`.
    pub fn name(self) -> &'static str {
        match self {
            Board::PiZero2W => "pi-zero-2w",
            Board::Pi3 => "pi3",
            Board::Pi4 => "pi4",
            Board::Pi5 => "pi5",
        }
    }

    /// The embedded `board/<name>.toml`.
    pub fn defaults_toml(self) -> &'static str {
        match self {
            Board::PiZero2W => include_str!("../../board/pi-zero-2w.toml"),
            Board::Pi3 => include_str!("../../board/pi3.toml"),
            Board::Pi4 => include_str!("../../board/pi4.toml"),
            Board::Pi5 => include_str!("../../board/pi5.toml"),
        }
    }
}

/// `[led]`: which LED shows the gateway's state, after board defaults are applied.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "RawLedConfig")]
pub struct LedConfig {
    /// `auto` (default), `sysfs`, `gpio` or `none`.
    pub driver: LedDriver,
    /// The LED-class directory; default `/sys/class/leds/ACT` (older kernels: `led0`, tried
    /// automatically when this ends in `ACT`).
    pub sysfs_path: PathBuf,
    /// Write brightness 0 for on and 1 for off (the Pi 5's ACT LED on some kernels).
    pub inverted: bool,
    /// GPIO character device; default `/dev/gpiochip0`.
    pub gpio_chip: PathBuf,
    /// GPIO line offset on `gpio_chip`; required for `driver = "gpio"`.
    pub gpio_line: Option<u32>,
    /// The GPIO LED lights when the line is low.
    pub active_low: bool,
    /// `pi-zero-2w`, `pi3`, `pi4` or `pi5`: take that board's defaults from `board/`.
    pub board: Option<Board>,
}

impl Default for LedConfig {
    fn default() -> Self {
        LedConfig {
            driver: LedDriver::Auto,
            sysfs_path: PathBuf::from("/sys/class/leds/ACT"),
            inverted: false,
            gpio_chip: PathBuf::from("/dev/gpiochip0"),
            gpio_line: None,
            active_low: false,
            board: None,
        }
    }
}

/// `[led]` as written: every key optional, so a board's defaults only fill what is left out.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawLedConfig {
    driver: Option<LedDriver>,
    sysfs_path: Option<PathBuf>,
    inverted: Option<bool>,
    gpio_chip: Option<PathBuf>,
    gpio_line: Option<u32>,
    active_low: Option<bool>,
    board: Option<Board>,
}

impl LedConfig {
    /// The defaults for `board`: the built-in defaults overlaid with `board/<name>.toml`.
    pub fn for_board(board: Board) -> Result<LedConfig, String> {
        let raw: RawLedConfig = toml::from_str(board.defaults_toml())
            .map_err(|e| format!("board/{}.toml: {e}", board.name()))?;
        if raw.board.is_some() {
            return Err(format!("board/{}.toml may not name a board", board.name()));
        }
        let mut config = LedConfig::default();
        config.apply(raw);
        config.board = Some(board);
        Ok(config)
    }

    fn apply(&mut self, raw: RawLedConfig) {
        let RawLedConfig {
            driver,
            sysfs_path,
            inverted,
            gpio_chip,
            gpio_line,
            active_low,
            board,
        } = raw;
        if let Some(v) = driver {
            self.driver = v;
        }
        if let Some(v) = sysfs_path {
            self.sysfs_path = v;
        }
        if let Some(v) = inverted {
            self.inverted = v;
        }
        if let Some(v) = gpio_chip {
            self.gpio_chip = v;
        }
        if let Some(v) = gpio_line {
            self.gpio_line = Some(v);
        }
        if let Some(v) = active_low {
            self.active_low = v;
        }
        if let Some(v) = board {
            self.board = Some(v);
        }
    }

    /// Refuses settings that cannot work (checked when the config is parsed, too).
    pub fn validate(&self) -> Result<(), String> {
        if self.driver == LedDriver::Gpio && self.gpio_line.is_none() {
            return Err("led.driver = \"gpio\" needs led.gpio_line".into());
        }
        Ok(())
    }
}

impl TryFrom<RawLedConfig> for LedConfig {
    type Error = String;

    fn try_from(raw: RawLedConfig) -> Result<Self, String> {
        let mut config = match raw.board {
            Some(board) => LedConfig::for_board(board)?,
            None => LedConfig::default(),
        };
        config.apply(raw);
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LedConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, LedConfig::default());
        assert_eq!(c.driver, LedDriver::Auto);
        assert_eq!(c.sysfs_path, PathBuf::from("/sys/class/leds/ACT"));
        assert_eq!(c.gpio_chip, PathBuf::from("/dev/gpiochip0"));
        assert!(!c.inverted && !c.active_low && c.gpio_line.is_none() && c.board.is_none());
    }

    #[test]
    fn every_board_file_parses() {
        for board in Board::ALL {
            let c = LedConfig::for_board(board).unwrap();
            assert_eq!(c.board, Some(board));
            assert_eq!(c.inverted, board == Board::Pi5, "{}", board.name());
        }
    }

    #[test]
    fn board_defaults_yield_to_explicit_keys() {
        let c = parse("board = \"pi5\"").unwrap();
        assert!(c.inverted);
        assert_eq!(c.driver, LedDriver::Sysfs);
        let c = parse("board = \"pi5\"\ninverted = false\ndriver = \"auto\"").unwrap();
        assert!(!c.inverted);
        assert_eq!(c.driver, LedDriver::Auto);
        let c = parse("board = \"pi-zero-2w\"").unwrap();
        assert!(!c.inverted);
    }

    #[test]
    fn mistakes_are_errors() {
        assert!(parse("colour = \"red\"").is_err());
        assert!(parse("driver = \"blink\"").is_err());
        assert!(parse("board = \"pi2\"").is_err());
        let e = parse("driver = \"gpio\"").unwrap_err();
        assert!(e.to_string().contains("gpio_line"), "{e}");
        let c = parse("driver = \"gpio\"\ngpio_line = 17\nactive_low = true").unwrap();
        assert_eq!(c.gpio_line, Some(17));
        assert!(c.active_low);
    }

    #[test]
    fn the_led_section_of_the_whole_config() {
        let c: crate::config::Config = toml::from_str("[led]\nboard = \"pi5\"\n").unwrap();
        assert!(c.led.inverted);
        let c: crate::config::Config = toml::from_str("").unwrap();
        assert_eq!(c.led, LedConfig::default());
        assert!(toml::from_str::<crate::config::Config>("[led]\nbogus = 1\n").is_err());
    }
}
