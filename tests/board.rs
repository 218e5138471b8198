//! The status LED end to end: `spawn` on a fake LED-class directory, driven by a health watch
//! on tokio's paused clock, then `stop` gives the LED back.

use std::path::Path;
use std::time::Duration;

use iris_gateway::board::{self, BoardState, LedConfig, LedDriver};
use iris_gateway::protocol::HealthState;
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn spawn_blinks_follows_health_and_restores_on_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let act = tmp.path().join("ACT");
    std::fs::create_dir(&act).unwrap();
    std::fs::write(act.join("trigger"), "none [mmc0] timer heartbeat\n").unwrap();
    std::fs::write(act.join("brightness"), "0\n").unwrap();
    let config = LedConfig {
        driver: LedDriver::Sysfs,
        sysfs_path: act.clone(),
        ..LedConfig::default()
    };
    let brightness = act.join("brightness");
    let (health_tx, health_rx) = watch::channel(HealthState::Online);

    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let t0 = Instant::now();
            let at = |ms: u64| t0 + Duration::from_millis(ms);
            let led = board::spawn(&config, BoardState::Starting, health_rx);
            assert!(led.has_led());
            // Starting: slow blink.
            sleep_until(at(250)).await;
            assert_eq!(read(&act.join("trigger")), "none");
            assert_eq!(read(&brightness), "1");
            sleep_until(at(750)).await;
            assert_eq!(read(&brightness), "0");
            // The listener is up: show the current health.
            led.show((*health_tx.borrow()).into());
            sleep_until(at(800)).await;
            assert_eq!(read(&brightness), "1");
            sleep_until(at(5_000)).await;
            assert_eq!(read(&brightness), "1", "steady on");
            // Restarting: fast blink from 5 000.
            health_tx.send_replace(HealthState::Restarting);
            sleep_until(at(5_150)).await;
            assert_eq!(read(&brightness), "0");
            sleep_until(at(5_250)).await;
            assert_eq!(read(&brightness), "1");
            led.stop().await;
            assert_eq!(read(&brightness), "0", "Stopped is off");
            assert_eq!(read(&act.join("trigger")), "mmc0", "trigger given back");
        })
        .await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_led_is_harmless() {
    let tmp = tempfile::tempdir().unwrap();
    let config = LedConfig {
        sysfs_path: tmp.path().join("ACT"),
        ..LedConfig::default()
    };
    let (health_tx, health_rx) = watch::channel(HealthState::Online);
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let led = board::spawn(&config, BoardState::Starting, health_rx);
            assert!(!led.has_led());
            tokio::time::sleep(Duration::from_secs(3)).await;
            health_tx.send_replace(HealthState::Degraded);
            drop(health_tx);
            tokio::time::sleep(Duration::from_secs(3)).await;
            led.stop().await;
        })
        .await;
}
