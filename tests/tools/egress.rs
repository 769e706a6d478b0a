//! The egress allow-list (`--shell-network allow=…`), tried from inside `shell` the way a
//! command would get around it, against a real server process: two HTTP servers on the
//! host's loopback, one under an allowed name and one not; the allowed one answers through
//! the proxy (plain HTTP and CONNECT), the other gets the proxy's 403 and never sees a
//! connection, a name on the list that resolves to loopback is refused, and neither a direct
//! connection nor DNS works inside. The names are under `.test`, given an address by the
//! test-only `--shell-network-test-resolve`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{is_postgres, TestServer};
use crate::tools::{allow_all, call, ended, model_calling, options, output_of};

/// An HTTP server on 127.0.0.1 that answers every request with `NAME got REQUEST-LINE` and
/// counts its connections.
async fn http_server(name: &'static str) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let line = text.lines().next().unwrap_or("");
                let body = format!("{name} got {line}");
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            });
        }
    });
    (port, connections)
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_allowed_hosts_are_reached_and_only_through_the_proxy() {
    if is_postgres() {
        return;
    }
    let (a, _) = http_server("A").await;
    let (b, b_connections) = http_server("B").await;
    let curl = "curl -sS --max-time 10";
    let command = format!(
        "echo \"plain: $({curl} 'http://allowed.test:{a}/path?q=1')\"; \
         echo \"tunnel: $({curl} -p http://allowed.test:{a}/tunnelled)\"; \
         echo \"literal: $({curl} http://127.0.0.1:{a}/literal)\"; \
         echo \"denied: $({curl} -w ' %{{http_code}}' http://denied.test:{b}/ | tr -d '\\n')\"; \
         echo \"denied port: $({curl} -w ' %{{http_code}}' http://allowed.test:{b}/ | tr -d '\\n')\"; \
         echo \"denied tunnel: $({curl} -p -o /dev/null -w '%{{http_connect}}' \
           http://denied.test:{b}/ 2>/dev/null)\"; \
         echo \"loopback name: $({curl} -w ' %{{http_code}}' http://localhost:{a}/ | tr -d '\\n')\"; \
         echo \"direct: $({curl} --noproxy '*' http://127.0.0.1:{a}/ >/dev/null 2>&1; echo $?)\"; \
         echo \"unset: $(env -u HTTP_PROXY -u http_proxy -u ALL_PROXY -u all_proxy \
           {curl} http://127.0.0.1:{b}/ >/dev/null 2>&1; echo $?)\"; \
         echo \"dns: $(getent hosts example.com >/dev/null 2>&1 && echo resolved || echo none)\"; \
         echo \"proxy: $HTTP_PROXY\""
    );
    let allow = format!("allow=allowed.test:{a},127.0.0.1:{a},localhost:{a}");
    let dir = tempfile::tempdir().unwrap();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![call("e1", "shell", json!({ "command": command }))]).await;
    let server = TestServer::start(
        options(
            &model,
            &[
                "--tool-policy",
                &policy,
                "--shell-network",
                &allow,
                "--shell-network-test-resolve",
                "allowed.test=127.0.0.1",
                "--shell-network-test-resolve",
                "denied.test=127.0.0.1",
            ],
        )
        .operator_token("egress-test-operator-token")
        .process(),
    )
    .await;
    let id = server.create_session().await;
    server.start_run(&id, "reach out").await;
    ended(&server, &id).await;
    let out = output_of(&server.events(&id).await, "e1");
    eprintln!("{out}");
    let line = |label: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{label}: ")))
            .unwrap_or_else(|| panic!("no {label} line: {out}"))
            .to_string()
    };
    assert_eq!(line("plain"), "A got GET /path?q=1 HTTP/1.1", "{out}");
    assert_eq!(line("tunnel"), "A got GET /tunnelled HTTP/1.1", "{out}");
    assert_eq!(line("literal"), "A got GET /literal HTTP/1.1", "{out}");
    assert_eq!(
        line("denied"),
        format!("tah egress proxy: denied.test:{b} is not on this server's egress allow-list 403")
    );
    assert_eq!(
        line("denied port"),
        format!("tah egress proxy: allowed.test:{b} is not on this server's egress allow-list 403")
    );
    assert_eq!(line("denied tunnel"), "403", "{out}");
    let loopback = line("loopback name");
    assert!(
        loopback.starts_with(&format!("tah egress proxy: localhost:{a} resolves to "))
            && loopback.ends_with(" 403"),
        "{out}"
    );
    // curl: 7, could not connect (the sandbox's loopback has nothing on that port).
    assert_eq!(line("direct"), "7", "{out}");
    assert_eq!(line("unset"), "7", "{out}");
    assert_eq!(line("dns"), "none", "{out}");
    assert_eq!(b_connections.load(Ordering::SeqCst), 0, "B was reached");
    // The call's proxy stopped with it.
    let proxy = line("proxy");
    let port = proxy
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("{proxy}"));
    let closed = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(format!("127.0.0.1:{port}")),
    )
    .await;
    assert!(matches!(closed, Ok(Err(_))), "the proxy still listens");
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_and_none_are_the_network_and_nothing_as_before() {
    if is_postgres() {
        return;
    }
    let (a, a_connections) = http_server("A").await;
    let command = format!(
        "echo \"got: $(curl -sS --max-time 5 http://127.0.0.1:{a}/ 2>/dev/null; echo \" $?\")\"; \
         echo \"proxy: ${{HTTP_PROXY:-unset}}\""
    );
    let dir = tempfile::tempdir().unwrap();
    let policy = allow_all(dir.path());
    // `--shell-network` alone is `all`, as the flag without a value always was.
    for (network, expected) in [
        (&["--shell-network"][..], "A got GET / HTTP/1.1 0"),
        (&["--shell-network", "none"][..], " 7"),
        (&["--shell-network=false"][..], " 7"),
    ] {
        let model = model_calling(vec![call("n1", "shell", json!({ "command": command }))]).await;
        let args = [&["--tool-policy", policy.as_str()][..], network].concat();
        let server = TestServer::start(
            options(&model, &args)
                .operator_token("egress-test-operator-token")
                .process(),
        )
        .await;
        let id = server.create_session().await;
        server.start_run(&id, "reach out").await;
        ended(&server, &id).await;
        let out = output_of(&server.events(&id).await, "n1");
        assert_eq!(
            out,
            format!("got: {expected}\nproxy: unset\nexit code 0"),
            "{network:?}"
        );
    }
    assert_eq!(a_connections.load(Ordering::SeqCst), 1);
}
