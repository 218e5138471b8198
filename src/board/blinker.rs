//! The blinker: plays the current state's pattern on an `OutputPin`.
//!
//! [`Blinker`] never reads a clock: every call is given `now`, so tests step time by hand and
//! production ([`run`]) passes tokio's clock and sleeps until the edge `tick` returns.

use std::time::Duration;

use embedded_hal::digital::OutputPin;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};
use tracing::{info, warn};

use super::pattern::{level_at, next_edge};
use super::BoardState;
use crate::protocol::HealthState;

/// How soon a failed write is retried when the pattern has no edge to retry on (steady on/off).
pub const RETRY_AFTER_ERROR: Duration = Duration::from_secs(2);

/// Drives `pin` with the pattern of the current [`BoardState`].
///
/// Writes happen only when the level changes (or the last write failed). A failed write is
/// logged once per run of failures (and the recovery once), the level is then treated as
/// unknown, and the pin is written again at the next edge.
#[derive(Debug)]
pub struct Blinker<P: OutputPin> {
    pin: P,
    state: BoardState,
    /// When the current pattern started.
    epoch: Instant,
    /// The level last written successfully; `None` before the first write or after a failure.
    written: Option<bool>,
    failing: bool,
    /// Warnings logged so far (one per run of failures).
    warnings: u32,
}

impl<P: OutputPin> Blinker<P> {
    /// A blinker showing `state` from `now`. Nothing is written until the first `tick`.
    pub fn new(pin: P, state: BoardState, now: Instant) -> Self {
        Blinker {
            pin,
            state,
            epoch: now,
            written: None,
            failing: false,
            warnings: 0,
        }
    }

    pub fn state(&self) -> BoardState {
        self.state
    }

    /// The level last written successfully (`true` = on); `None` if unknown.
    pub fn level(&self) -> Option<bool> {
        self.written
    }

    /// Whether the last write failed.
    pub fn failing(&self) -> bool {
        self.failing
    }

    pub fn pin(&self) -> &P {
        &self.pin
    }

    pub fn pin_mut(&mut self) -> &mut P {
        &mut self.pin
    }

    pub fn into_pin(self) -> P {
        self.pin
    }

    /// Switches to `state`'s pattern at once (from its beginning) and writes the level it
    /// starts with. The same state again changes nothing, so the rhythm is not disturbed.
    /// Returns when to tick next, like [`tick`](Self::tick).
    pub fn set_state(&mut self, state: BoardState, now: Instant) -> Option<Instant> {
        if state != self.state {
            self.state = state;
            self.epoch = now;
        }
        self.tick(now)
    }

    /// Writes the level the pattern has at `now` if it differs from the last one written.
    /// Returns the next edge (when to tick again), or `None` if the level never changes. After a
    /// failed write on a steady pattern, returns `now + RETRY_AFTER_ERROR` instead.
    pub fn tick(&mut self, now: Instant) -> Option<Instant> {
        let elapsed = now.saturating_duration_since(self.epoch);
        let level = level_at(self.state, elapsed);
        if self.written != Some(level) {
            let result = if level {
                self.pin.set_high()
            } else {
                self.pin.set_low()
            };
            match result {
                Ok(()) => {
                    self.written = Some(level);
                    if self.failing {
                        self.failing = false;
                        info!("status LED: writes work again");
                    }
                }
                Err(e) => {
                    self.written = None;
                    if !self.failing {
                        self.failing = true;
                        self.warnings += 1;
                        warn!("status LED: write failed, retrying at the next edge: {e:?}");
                    }
                }
            }
        }
        match next_edge(self.state, elapsed) {
            Some(edge) => Some(self.epoch + edge),
            None if self.failing => Some(now + RETRY_AFTER_ERROR),
            None => None,
        }
    }
}

/// Production driver: shows `initial`, then follows `health` (each change switches pattern at
/// once) and `control` (states the owner sets, e.g. `Starting` again). Ends when `control`
/// delivers [`BoardState::Stopped`] or closes: the LED is set to `Stopped` (off) and the pin is
/// handed back, e.g. to restore its trigger. If the health sender goes away, the last state
/// stays on until then.
///
/// The task sleeps until the next pattern edge (`sleep_until`) or a state change; a steady
/// pattern never wakes it. Each wake does at most one tiny write (see `drivers`), so the event
/// loop is never held up.
pub async fn run<P: OutputPin>(
    pin: P,
    initial: BoardState,
    mut health: watch::Receiver<HealthState>,
    mut control: mpsc::UnboundedReceiver<BoardState>,
) -> P {
    let mut blinker = Blinker::new(pin, initial, Instant::now());
    let mut next = blinker.tick(Instant::now());
    let mut health_open = true;
    while blinker.state() != BoardState::Stopped {
        // The sleep is built even when disabled, so it needs some deadline.
        let deadline = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        next = tokio::select! {
            () = sleep_until(deadline), if next.is_some() => blinker.tick(Instant::now()),
            changed = health.changed(), if health_open => match changed {
                Ok(()) => {
                    let state = BoardState::from(*health.borrow_and_update());
                    blinker.set_state(state, Instant::now())
                }
                Err(_) => {
                    health_open = false;
                    next
                }
            },
            state = control.recv() => {
                blinker.set_state(state.unwrap_or(BoardState::Stopped), Instant::now())
            }
        };
    }
    blinker.into_pin()
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::convert::Infallible;
    use std::rc::Rc;

    use embedded_hal::digital::{ErrorKind, ErrorType};

    use super::*;

    /// A stepped test clock: time moves only when the test says so.
    #[derive(Clone)]
    struct TestClock {
        t0: Instant,
        now: Rc<Cell<Instant>>,
    }

    impl TestClock {
        fn new() -> Self {
            let t0 = Instant::now();
            TestClock {
                t0,
                now: Rc::new(Cell::new(t0)),
            }
        }
        fn now(&self) -> Instant {
            self.now.get()
        }
        fn set(&self, t: Instant) {
            self.now.set(t)
        }
        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }
        fn ms(&self, t: Instant) -> u64 {
            (t - self.t0).as_millis() as u64
        }
    }

    /// Records (ms since t0, level) for every write; fails the writes whose (0-based) numbers
    /// are in `fail`.
    struct FakePin {
        clock: TestClock,
        log: Rc<RefCell<Vec<(u64, bool)>>>,
        writes: usize,
        fail: Vec<usize>,
    }

    #[derive(Debug)]
    struct Gone;

    impl embedded_hal::digital::Error for Gone {
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    impl FakePin {
        fn new(clock: &TestClock) -> Self {
            FakePin {
                clock: clock.clone(),
                log: Rc::default(),
                writes: 0,
                fail: Vec::new(),
            }
        }
        fn write(&mut self, level: bool) -> Result<(), Gone> {
            let n = self.writes;
            self.writes += 1;
            if self.fail.contains(&n) {
                return Err(Gone);
            }
            let t = self.clock.ms(self.clock.now());
            self.log.borrow_mut().push((t, level));
            Ok(())
        }
    }

    impl ErrorType for FakePin {
        type Error = Gone;
    }

    impl OutputPin for FakePin {
        fn set_low(&mut self) -> Result<(), Gone> {
            self.write(false)
        }
        fn set_high(&mut self) -> Result<(), Gone> {
            self.write(true)
        }
    }

    /// Plays the blinker like `run` would, stepping the clock edge to edge, until `until_ms`
    /// (exclusive). Returns the next wake-up it was asked for, in ms.
    fn play(b: &mut Blinker<FakePin>, clock: &TestClock, until_ms: u64) -> Option<u64> {
        loop {
            let next = b.tick(clock.now());
            match next {
                Some(t) if clock.ms(t) < until_ms => clock.set(t),
                other => return other.map(|t| clock.ms(t)),
            }
        }
    }

    fn edges(state: BoardState, periods_ms: u64) -> (Vec<(u64, bool)>, Option<u64>) {
        let clock = TestClock::new();
        let pin = FakePin::new(&clock);
        let log = pin.log.clone();
        let mut b = Blinker::new(pin, state, clock.now());
        let next = play(&mut b, &clock, periods_ms);
        let edges = log.borrow().clone();
        (edges, next)
    }

    #[test]
    fn each_state_over_two_periods() {
        use BoardState::*;
        let on = true;
        let off = false;
        assert_eq!(
            edges(Starting, 2000),
            (
                vec![(0, on), (500, off), (1000, on), (1500, off)],
                Some(2000)
            )
        );
        assert_eq!(edges(Online, 2000), (vec![(0, on)], None));
        assert_eq!(
            edges(Degraded, 3000),
            (
                vec![
                    (0, on),
                    (150, off),
                    (300, on),
                    (450, off),
                    (1500, on),
                    (1650, off),
                    (1800, on),
                    (1950, off)
                ],
                Some(3000)
            )
        );
        assert_eq!(
            edges(Restarting, 400),
            (vec![(0, on), (100, off), (200, on), (300, off)], Some(400))
        );
        assert_eq!(edges(Stopped, 2000), (vec![(0, off)], None));
    }

    #[test]
    fn a_state_change_mid_period_switches_at_once() {
        let clock = TestClock::new();
        let pin = FakePin::new(&clock);
        let log = pin.log.clone();
        let mut b = Blinker::new(pin, BoardState::Starting, clock.now());
        assert_eq!(play(&mut b, &clock, 700), Some(1000));
        // 700 ms in: Starting is dark; Degraded starts lit, now, and runs from here.
        clock.set(clock.at(700));
        let next = b.set_state(BoardState::Degraded, clock.now());
        assert_eq!(next, Some(clock.at(850)));
        clock.set(clock.at(850));
        assert_eq!(play(&mut b, &clock, 2300), Some(2350));
        // The same state again does not restart the rhythm.
        clock.set(clock.at(2250));
        let next = b.set_state(BoardState::Degraded, clock.now());
        assert_eq!(next, Some(clock.at(2350)));
        // Online while lit: steady on, nothing to write, no more wake-ups.
        clock.set(clock.at(2300));
        assert_eq!(b.set_state(BoardState::Online, clock.now()), None);
        assert_eq!(
            *log.borrow(),
            vec![
                (0, true),
                (500, false),
                (700, true),
                (850, false),
                (1000, true),
                (1150, false),
                (2200, true),
            ]
        );
        assert_eq!(b.level(), Some(true));
    }

    #[test]
    fn survives_pin_errors_and_recovers() {
        let clock = TestClock::new();
        let mut pin = FakePin::new(&clock);
        // Writes: 0 on@0 ok, 1 off@100 fails, 2 on@200 fails, 3 off@300 ok, 4 on@400 ok,
        // 5 off@500 fails (a second run of failures), 6 on@600 ok.
        pin.fail = vec![1, 2, 5];
        let log = pin.log.clone();
        let mut b = Blinker::new(pin, BoardState::Restarting, clock.now());
        assert_eq!(play(&mut b, &clock, 150), Some(200));
        assert!(b.failing());
        assert_eq!(b.level(), None);
        assert_eq!(b.warnings, 1);
        clock.set(clock.at(200));
        assert_eq!(play(&mut b, &clock, 450), Some(500));
        assert!(!b.failing());
        assert_eq!(b.warnings, 1, "one warning per run of failures");
        clock.set(clock.at(500));
        play(&mut b, &clock, 700);
        assert_eq!(b.warnings, 2);
        assert_eq!(
            *log.borrow(),
            vec![(0, true), (300, false), (400, true), (600, true)]
        );
        assert!(!b.failing());
    }

    #[test]
    fn a_steady_pattern_retries_after_an_error() {
        let clock = TestClock::new();
        let mut pin = FakePin::new(&clock);
        pin.fail = vec![0];
        let log = pin.log.clone();
        let mut b = Blinker::new(pin, BoardState::Online, clock.now());
        let retry = b.tick(clock.now());
        assert_eq!(retry, Some(clock.now() + RETRY_AFTER_ERROR));
        clock.set(retry.unwrap());
        assert_eq!(b.tick(clock.now()), None);
        assert_eq!(*log.borrow(), vec![(2000, true)]);
    }

    /// A pin that timestamps writes with tokio's (paused) clock.
    struct TokioPin {
        t0: Instant,
        log: Rc<RefCell<Vec<(u64, bool)>>>,
    }

    impl ErrorType for TokioPin {
        type Error = Infallible;
    }

    impl OutputPin for TokioPin {
        fn set_low(&mut self) -> Result<(), Infallible> {
            let t = (Instant::now() - self.t0).as_millis() as u64;
            self.log.borrow_mut().push((t, false));
            Ok(())
        }
        fn set_high(&mut self) -> Result<(), Infallible> {
            let t = (Instant::now() - self.t0).as_millis() as u64;
            self.log.borrow_mut().push((t, true));
            Ok(())
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn run_follows_health_without_real_waiting() {
        let started = std::time::Instant::now();
        let t0 = Instant::now();
        let log = Rc::new(RefCell::new(Vec::new()));
        let pin = TokioPin {
            t0,
            log: log.clone(),
        };
        let (health_tx, health_rx) = watch::channel(HealthState::Online);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let local = tokio::task::LocalSet::new();
        let task = local.spawn_local(run(pin, BoardState::Starting, health_rx, control_rx));
        local
            .run_until(async {
                tokio::time::sleep_until(t0 + Duration::from_millis(1200)).await;
                health_tx.send_replace(HealthState::Degraded);
                tokio::time::sleep_until(t0 + Duration::from_millis(3000)).await;
                health_tx.send_replace(HealthState::Online);
                tokio::time::sleep_until(t0 + Duration::from_millis(60_000)).await;
                health_tx.send_replace(HealthState::Restarting);
                tokio::time::sleep_until(t0 + Duration::from_millis(60_250)).await;
                control_tx.send(BoardState::Stopped).unwrap();
                task.await.unwrap();
            })
            .await;
        assert_eq!(
            *log.borrow(),
            vec![
                // Starting
                (0, true),
                (500, false),
                (1000, true),
                // Degraded from 1200 (it starts lit, and the LED was lit: no write)
                (1350, false),
                (1500, true),
                (1650, false),
                (2700, true),
                (2850, false),
                // Online from 3000, steady, no wake-ups for a minute
                (3000, true),
                // Restarting from 60 000
                (60_100, false),
                (60_200, true),
                // Stopped
                (60_250, false),
            ]
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no real waiting"
        );
    }
}
