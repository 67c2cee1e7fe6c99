//! Debian's headless `chromium`, driven over the Chrome DevTools protocol by
//! a small client on tokio-tungstenite: open a page, evaluate JavaScript in
//! it, wait (with a deadline) until its DOM shows something, and take a
//! screenshot. Each browser gets a fresh profile in its own temp dir and is
//! killed (with its renderers, one process group) on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{DEADLINE, eventually};

/// How often `wait_for` looks at the page again.
const POLL: Duration = Duration::from_millis(100);

/// A headless Chromium with one page open.
pub struct Browser {
    process: Chromium,
    /// The DevTools connection to the page.
    page: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

/// The chromium process and its temp dir (profile and log).
struct Chromium {
    child: Child,
    dir: tempfile::TempDir,
}

/// The `chromium` binary (or `$CHROMIUM`); panics saying how to install it.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return path.into();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromium"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "chromium is not installed, and the web view's browser test needs it: \
                 run scripts/ensure-chromium (scripts/test does), or set CHROMIUM to its path"
            )
        })
}

impl Browser {
    /// Starts `chromium` headless on a free DevTools port, with a window of
    /// `width` x `height`, and connects to its blank page.
    pub async fn launch(width: u32, height: u32) -> Browser {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let profile = dir.path().join("profile");
        let log = std::fs::File::create(dir.path().join("chromium.log")).expect("log file");
        let child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("spawn chromium");
        let mut process = Chromium { child, dir };
        let port = process.devtools_port(&profile).await;
        let url = eventually("chromium's blank page to be listed", || page_url(port)).await;
        let page = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("connect to the page's DevTools socket")
            .0;
        Browser {
            process,
            page,
            next_id: 1,
        }
    }

    /// What chromium has logged.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Sends one DevTools command and returns its result; panics on an error.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .await
            .unwrap_or_else(|error| panic!("{method} failed: {error}"))
    }

    /// Sends one DevTools command and returns its result, or its error.
    async fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        let command = json!({"id": id, "method": method, "params": params});
        self.page
            .send(Message::text(command.to_string()))
            .await
            .expect("send a DevTools command");
        loop {
            let message = tokio::time::timeout(DEADLINE, self.page.next())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method} within the deadline"))
                .expect("the DevTools socket closed")
                .expect("the DevTools socket failed");
            let Message::Text(text) = message else {
                continue;
            };
            let mut reply: Value = serde_json::from_str(&text).expect("DevTools sends JSON");
            if reply["id"] != id {
                continue; // an event
            }
            return match reply.get("error") {
                Some(error) => Err(error.clone()),
                None => Ok(reply["result"].take()),
            };
        }
    }

    /// Opens `url` in the page, and waits until its document has loaded.
    pub async fn goto(&mut self, url: &str) {
        let result = self.call("Page.navigate", json!({"url": url})).await;
        assert!(
            result.get("errorText").is_none(),
            "navigate to {url}: {result}"
        );
        let loaded = format!("location.href === {url:?} && document.readyState === 'complete'");
        self.wait_for(&format!("{url} to load"), &loaded).await;
    }

    /// The value of `expression` (awaited when it is a promise); panics on an
    /// exception, with its text.
    pub async fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression)
            .await
            .unwrap_or_else(|error| panic!("{expression}\nthrew: {error}"))
    }

    /// The value of `expression`, or the exception or error it met.
    async fn try_eval(&mut self, expression: &str) -> Result<Value, Value> {
        let params = json!({"expression": expression, "returnByValue": true, "awaitPromise": true});
        let mut result = self.try_call("Runtime.evaluate", params).await?;
        match result.get("exceptionDetails") {
            Some(exception) => Err(exception.clone()),
            None => Ok(result["result"]["value"].take()),
        }
    }

    /// Waits until `expression` is truthy (not null, false, 0 or ""), and
    /// returns it; an exception (while a page loads, say) counts as not yet.
    /// After DEADLINE it panics with the page's text.
    pub async fn wait_for(&mut self, what: &str, expression: &str) -> Value {
        let start = Instant::now();
        loop {
            let value = self.try_eval(expression).await.unwrap_or(Value::Null);
            let falsy = matches!(&value, Value::Null | Value::Bool(false))
                || value == json!(0)
                || value == json!("");
            if !falsy {
                return value;
            }
            if start.elapsed() > DEADLINE {
                let text = self.try_eval("document.body.innerText").await;
                panic!("timed out waiting for {what}; the page reads:\n{text:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Saves a PNG of the page's viewport at `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let data = shot["data"].as_str().expect("screenshot data");
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64 screenshot");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

/// The DevTools socket of the first page target on `port`, once listed.
async fn page_url(port: u16) -> Option<String> {
    let client = reqwest::Client::builder().no_proxy().build().ok()?;
    let list = client
        .get(format!("http://127.0.0.1:{port}/json/list"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let targets: Vec<Value> = serde_json::from_str(&list).ok()?;
    targets
        .iter()
        .find(|t| t["type"] == "page")
        .and_then(|t| t["webSocketDebuggerUrl"].as_str())
        .map(str::to_owned)
}

impl Chromium {
    /// The DevTools port, from the `DevToolsActivePort` file that chromium
    /// writes into its profile; panics with chromium's log if it exits.
    async fn devtools_port(&mut self, profile: &Path) -> u16 {
        let file = profile.join("DevToolsActivePort");
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if let Some(port) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
                return port;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "chromium exited ({status}) before opening DevTools:\n{}",
                    self.log()
                );
            }
            assert!(
                start.elapsed() < DEADLINE,
                "chromium opened no DevTools port:\n{}",
                self.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// What chromium has logged.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("chromium.log")).unwrap_or_default()
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // The whole process group: the browser and its renderers.
        let pid = self.child.id() as i32;
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}
