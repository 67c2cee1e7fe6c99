//! Waiting for an event with a deadline, by polling: the one retry loop of
//! the tests and the bench. A wait polls at once, then pauses (5 ms doubling
//! up to 200 ms, or a fixed pause), and gives up when its time is out.
//! [`eventually`] is the tests' form: it panics after [`DEADLINE`].

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// A deadline long enough for a loaded CI machine, short enough to fail fast.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The first pause of a wait whose pause grows.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
/// The longest pause of a wait whose pause grows.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// Polls `probe` until it returns Some, or panics after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let wait = Wait::new(what, DEADLINE).until(probe).await;
    wait.unwrap_or_else(|e| panic!("{e}"))
}

/// A wait that ran out of time.
#[derive(Debug, Clone)]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    /// How long it was awaited.
    pub after: Duration,
    /// What the last probe said, when it said why it was not done.
    pub last: Option<String>,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "timed out waiting for {} ({:?})", self.what, self.after)?;
        match &self.last {
            Some(last) => write!(f, "; last: {last}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for TimedOut {}

/// One wait: what it waits for, how long, and how it pauses between probes.
#[derive(Debug, Clone)]
pub struct Wait {
    /// What is awaited, for the error.
    what: String,
    /// How long the wait may last.
    timeout: Duration,
    /// The pause after the first probe.
    pause: Duration,
    /// The longest pause, which the pause doubles up to.
    max_pause: Duration,
}

impl Wait {
    /// A wait for `what` of at most `timeout`, pausing 5 ms doubling up to
    /// 200 ms between probes.
    pub fn new(what: impl Into<String>, timeout: Duration) -> Wait {
        Wait {
            what: what.into(),
            timeout,
            pause: FIRST_PAUSE,
            max_pause: MAX_PAUSE,
        }
    }

    /// Pauses `pause` between probes, always: for a wait whose end is timed.
    pub fn every(mut self, pause: Duration) -> Wait {
        self.pause = pause;
        self.max_pause = pause;
        self
    }

    /// Polls `probe` until it returns Some.
    pub async fn until<T, F, Fut>(self, mut probe: F) -> Result<T, TimedOut>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let mut clock = Clock::start(self);
        loop {
            if let Some(value) = probe().await {
                return Ok(value);
            }
            tokio::time::sleep(clock.next_pause(None)?).await;
        }
    }

    /// Polls `probe` until it returns Ok; the last error it returned goes
    /// into the [`TimedOut`].
    pub async fn until_ok<T, E, F, Fut>(self, mut probe: F) -> Result<T, TimedOut>
    where
        E: fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut clock = Clock::start(self);
        loop {
            match probe().await {
                Ok(value) => return Ok(value),
                Err(e) => tokio::time::sleep(clock.next_pause(Some(e.to_string()))?).await,
            }
        }
    }

    /// [`Wait::until_ok`] for a caller that is not async: the pauses block
    /// the thread.
    pub fn until_blocking<T, E, F>(self, mut probe: F) -> Result<T, TimedOut>
    where
        E: fmt::Display,
        F: FnMut() -> Result<T, E>,
    {
        let mut clock = Clock::start(self);
        loop {
            match probe() {
                Ok(value) => return Ok(value),
                Err(e) => std::thread::sleep(clock.next_pause(Some(e.to_string()))?),
            }
        }
    }
}

/// A running [`Wait`]: when it started and its next pause.
struct Clock {
    /// The wait.
    wait: Wait,
    /// When it started.
    started: Instant,
}

impl Clock {
    /// Starts the clock of `wait`.
    fn start(wait: Wait) -> Clock {
        Clock {
            wait,
            started: Instant::now(),
        }
    }

    /// The pause before the next probe, or the error once the time is out.
    fn next_pause(&mut self, last: Option<String>) -> Result<Duration, TimedOut> {
        let after = self.started.elapsed();
        if after >= self.wait.timeout {
            return Err(TimedOut {
                what: self.wait.what.clone(),
                after,
                last,
            });
        }
        let pause = self.wait.pause;
        self.wait.pause = (pause * 2).min(self.wait.max_pause);
        Ok(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait returns the probe's value once it has one.
    #[test]
    fn returns_once_the_probe_succeeds() {
        let mut tries = 0;
        let wait = Wait::new("three tries", DEADLINE).every(Duration::from_millis(1));
        let value = wait.until_blocking(|| {
            tries += 1;
            if tries < 3 { Err("not yet") } else { Ok(tries) }
        });
        assert_eq!(value.unwrap(), 3);
    }

    /// A wait that runs out of time says what it waited for and what the
    /// last probe said.
    #[test]
    fn times_out_with_the_last_error() {
        let wait = Wait::new("a miracle", Duration::from_millis(20));
        let err = wait
            .until_blocking(|| Err::<(), _>("still none"))
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("timed out waiting for a miracle"),
            "{message}"
        );
        assert!(message.ends_with("; last: still none"), "{message}");
    }
}
