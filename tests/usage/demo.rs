//! A server started the way the manual starts one, and requests written the way the manual
//! writes them: a [`Curl`] renders as the curl command a reader types and is sent as the same
//! request, so the command shown and the answer shown cannot drift apart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use tah::app::ReadyLine;
use tempfile::TempDir;
use tokio::process::Child;

use crate::usage::readme::Transcript;
use crate::usage::shown::{frames, Frame, Json};
use crate::usage::tah;

/// How long the server may take to be ready, and a stream to show what is asked for.
const PATIENCE: Duration = Duration::from_secs(30);

/// A directory to run the manual's commands in, removed when dropped.
pub fn scratch() -> TempDir {
    tempfile::Builder::new()
        .prefix("tah-readme-")
        .tempdir()
        .expect("create a directory")
}

/// Writes `text` and a newline to `path` under `dir`, as `echo 'text' > path` does.
pub fn echo_into(dir: &Path, path: &str, text: &str) {
    let path = dir.join(path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir -p");
    }
    std::fs::write(path, format!("{text}\n")).expect("write a file");
}

/// `tah serve` as the manual runs it, in its own directory (so its database is the default
/// `.tah/data.db` there), on a port the system picks instead of 8080.
pub struct Demo {
    pub addr: SocketAddr,
    client: reqwest::Client,
    vars: Vec<(String, String)>,
    log: PathBuf,
    _child: Child,
}

impl Demo {
    pub async fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Demo {
        let log = dir.join("tah.log");
        let mut child = tah()
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("create the log"))
            .spawn()
            .expect("start tah serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let ready = tokio::time::timeout(PATIENCE, ReadyLine::read(stdout))
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                panic!(
                    "tah serve {args:?} did not start; its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        Demo {
            addr: ready.listening,
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("an HTTP client"),
            vars: Vec::new(),
            log,
            _child: child,
        }
    }

    /// A shell variable the manual's commands use (`$SESSION`).
    pub fn set(&mut self, name: &str, value: &str) {
        self.vars.retain(|(n, _)| n != name);
        self.vars.push((name.to_string(), value.to_string()));
    }

    /// `text` with `$NAME` replaced by the variables' values, as the shell would.
    fn expand(&self, text: &str) -> String {
        // Longest names first, so that $SESSION is not read as $SESS.
        let mut vars = self.vars.clone();
        vars.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
        vars.iter().fold(text.to_string(), |text, (name, value)| {
            text.replace(&format!("${name}"), value)
        })
    }

    fn request(&self, curl: &Curl) -> reqwest::RequestBuilder {
        let url = format!("http://{}{}", self.addr, self.expand(&curl.path));
        let method =
            reqwest::Method::from_bytes(curl.method.unwrap_or("GET").as_bytes()).expect("a method");
        let mut request = self.client.request(method, url);
        for header in curl.headers.iter().chain(&curl.implicit) {
            let header = self.expand(header);
            let (name, value) = header.split_once(": ").expect("a header is NAME: VALUE");
            request = request.header(name, value);
        }
        if let Some(body) = &curl.body {
            request = request.body(body.clone());
        }
        request
    }

    /// Sends the request and reads the whole answer.
    pub async fn send(&self, curl: &Curl) -> Reply {
        let response = tokio::time::timeout(PATIENCE, self.request(curl).send())
            .await
            .unwrap_or_else(|_| panic!("no answer to {}", curl.command()))
            .unwrap_or_else(|e| panic!("{}: {e}", curl.command()));
        let status = response.status();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| {
                let value = value.to_str().unwrap_or_default().to_string();
                (name.to_string(), value)
            })
            .collect();
        let body = tokio::time::timeout(PATIENCE, response.text())
            .await
            .unwrap_or_else(|_| panic!("the answer to {} did not end", curl.command()))
            .expect("read the body");
        Reply {
            status,
            headers,
            body,
        }
    }

    /// Opens an SSE stream and reads frames until `enough` says so (the stream stays open on
    /// the server until it is dropped here; [`Stream::until`] reads on).
    pub async fn stream_until(&self, curl: &Curl, enough: impl Fn(&[Frame]) -> bool) -> Stream {
        let response = self.request(curl).send().await.expect("open the stream");
        assert_eq!(response.status(), StatusCode::OK, "{}", curl.command());
        let mut stream = Stream {
            frames: Vec::new(),
            command: curl.command(),
            bytes: Vec::new(),
            response,
        };
        stream.until(enough).await;
        stream
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The frames of an SSE body that have ended (a frame ends with a blank line).
fn frames_complete(body: &str) -> Vec<Frame> {
    match body.rfind("\n\n") {
        Some(end) => frames(&body[..end + 2]),
        None => Vec::new(),
    }
}

/// An open SSE stream and the frames read from it so far.
pub struct Stream {
    pub frames: Vec<Frame>,
    command: String,
    bytes: Vec<u8>,
    /// Kept open until the stream is dropped, as a reader's curl would be.
    response: reqwest::Response,
}

impl Stream {
    /// Reads on until the frames read so far (from the stream's start) are `enough`, or the
    /// stream ends.
    pub async fn until(&mut self, enough: impl Fn(&[Frame]) -> bool) {
        let read = async {
            loop {
                let body = String::from_utf8_lossy(&self.bytes).into_owned();
                let complete = frames_complete(&body);
                if enough(&complete) {
                    return complete;
                }
                match self.response.chunk().await.expect("read the stream") {
                    Some(chunk) => self.bytes.extend_from_slice(&chunk),
                    None => return frames(&body),
                }
            }
        };
        self.frames = tokio::time::timeout(PATIENCE, read)
            .await
            .unwrap_or_else(|_| panic!("{}: the stream did not show enough", self.command));
    }
}

/// A curl command of the manual: what it shows, and the request it sends.
#[derive(Debug, Clone)]
pub struct Curl {
    flags: String,
    method: Option<&'static str>,
    path: String,
    headers: Vec<String>,
    /// Headers curl adds by itself (not shown).
    implicit: Vec<String>,
    body: Option<String>,
}

impl Curl {
    /// `curl FLAGS localhost:8080PATH`.
    pub fn new(flags: &str, path: &str) -> Curl {
        Curl {
            flags: flags.to_string(),
            method: None,
            path: path.to_string(),
            headers: Vec::new(),
            implicit: Vec::new(),
            body: None,
        }
    }

    pub fn get(path: &str) -> Curl {
        Curl::new("-s", path)
    }

    pub fn post(path: &str) -> Curl {
        Curl::new("-s", path).method("POST")
    }

    pub fn method(mut self, method: &'static str) -> Curl {
        self.method = Some(method);
        self
    }

    pub fn flags(mut self, flags: &str) -> Curl {
        self.flags = flags.to_string();
        self
    }

    pub fn header(mut self, header: &str) -> Curl {
        self.headers.push(header.to_string());
        self
    }

    pub fn sse(self) -> Curl {
        self.header("Accept: text/event-stream")
    }

    /// `-H 'Content-Type: application/json' -d 'BODY'`.
    pub fn json(mut self, body: &str) -> Curl {
        assert!(!body.contains('\''), "the body goes in single quotes");
        self.headers
            .push("Content-Type: application/json".to_string());
        self.body = Some(body.to_string());
        self
    }

    /// `-d 'BODY'` alone, which curl sends as a form.
    pub fn data(mut self, body: &str) -> Curl {
        assert!(!body.contains('\''), "the body goes in single quotes");
        self.implicit
            .push("Content-Type: application/x-www-form-urlencoded".to_string());
        self.body = Some(body.to_string());
        self
    }

    /// The command line as the manual shows it.
    pub fn command(&self) -> String {
        let mut words = vec!["curl".to_string(), self.flags.clone()];
        if let Some(method) = self.method {
            words.push(format!("-X {method}"));
        }
        let url = format!("localhost:8080{}", self.path);
        // The shell would expand `?` and `&`; double quotes keep `$SESSION` working.
        words.push(if url.contains(['?', '&']) {
            format!("\"{url}\"")
        } else {
            url
        });
        for header in &self.headers {
            words.push(if header.contains('$') {
                format!("-H \"{header}\"")
            } else {
                format!("-H '{header}'")
            });
        }
        if let Some(body) = &self.body {
            words.push(format!("-d '{body}'"));
        }
        words.join(" ")
    }
}

/// An answer, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Json {
        Json::parse(&self.body)
    }

    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// What `curl -si` prints, with only the headers named in `shown` (in the server's order)
    /// and `…` for the rest.
    pub fn with_head(&self, shown: &[&str], body: &str) -> String {
        let mut out = format!(
            "HTTP/1.1 {} {}\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or_default()
        );
        for (name, value) in &self.headers {
            if shown.contains(&name.as_str()) {
                out.push_str(&format!("{name}: {value}\n"));
            }
        }
        out.push_str("…\n");
        if !body.is_empty() {
            out.push('\n');
            out.push_str(body);
        }
        out
    }

    pub fn expect(self, status: StatusCode, what: &str) -> Reply {
        assert_eq!(self.status, status, "{what}: {}", self.body);
        self
    }
}

/// `VAR=$(curl … | python3 -c '…print(json.load(sys.stdin)PICK)')`: the command that keeps one
/// value of an answer in a shell variable, `PICK` being e.g. `["id"]`.
pub fn capture(var: &str, curl: &Curl, pick: &str) -> String {
    format!(
        "{var}=$({} | python3 -c 'import sys,json;print(json.load(sys.stdin){pick})')",
        curl.command()
    )
}

/// A scenario in progress: the server it runs against and the manual's blocks it writes.
pub struct Walk {
    pub demo: Demo,
    pub t: Transcript,
}

impl Walk {
    /// Sends `curl`, expects `status`, and shows the command with the body it answered.
    pub async fn show(&mut self, curl: &Curl, status: StatusCode) -> Reply {
        self.show_as(curl, status, |reply| reply.body.clone()).await
    }

    /// Like [`Walk::show`], with the output shown as `output` renders the answer.
    pub async fn show_as(
        &mut self,
        curl: &Curl,
        status: StatusCode,
        output: impl FnOnce(&Reply) -> String,
    ) -> Reply {
        let reply = self.demo.send(curl).await.expect(status, &curl.command());
        self.t.command(&curl.command(), &output(&reply));
        reply
    }

    /// Sends `curl`, keeps the value at `pointer` (`/id`, `/data/0/id`) of its answer in
    /// `$var`, and shows the command that does so in a shell.
    pub async fn capture(&mut self, var: &str, curl: &Curl, pointer: &str) -> String {
        let reply = self.demo.send(curl).await;
        assert!(
            reply.status.is_success(),
            "{}: {}",
            curl.command(),
            reply.body
        );
        let value = reply
            .value()
            .pointer(pointer)
            .and_then(|v| v.as_str().map(str::to_string));
        let value = value.unwrap_or_else(|| panic!("no {pointer} in {}", reply.body));
        let pick: String = pointer
            .split('/')
            .skip(1)
            .map(|key| match key.parse::<usize>() {
                Ok(n) => format!("[{n}]"),
                Err(_) => format!("[\"{key}\"]"),
            })
            .collect();
        self.demo.set(var, &value);
        self.t.command(&capture(var, curl, &pick), "");
        value
    }
}
