//! Processes on free loopback ports, and the workspace's binaries.
//!
//! A port found free by binding port 0 and letting it go can be taken again before the
//! server binds it (another test's listener, or an outgoing connection given the same
//! ephemeral port), and the server then exits with "Address already in use". The helper here
//! starts the process, waits until it listens on both ports (its own listening sockets, read
//! from /proc, not merely something accepting there), and starts it again on new ports when
//! it exited first.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How many times a process that exited before listening is started again.
const ATTEMPTS: usize = 8;

/// The workspace binary `name` (`thunder-server`, `thunder-cli`) in the target directory of
/// the running test: cargo puts a test in `<target>/<profile>/deps/` and the binaries in
/// `<target>/<profile>/`. Cargo builds a package's own binaries before its integration tests;
/// another package's are there after `cargo build -p PACKAGE` (or a workspace build, as
/// `cargo nextest run --workspace` makes). Panics, saying so, when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let test = std::env::current_exe().expect("the test's own path");
    let path = test
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join(format!("{name}{}", std::env::consts::EXE_SUFFIX)))
        .unwrap_or_default();
    assert!(
        path.is_file(),
        "{} is missing: build it first with `cargo build -p {name}`",
        path.display()
    );
    path
}

/// A 127.0.0.1 address whose port was free a moment ago.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free 127.0.0.1 port")
}

/// A process started by [`spawn_listening`] and the two addresses it listens on.
pub struct Listening {
    /// The process.
    pub child: Child,
    /// The first address given to the command (the gRPC port, by convention).
    pub grpc: SocketAddr,
    /// The second address given to the command (the admin port, by convention).
    pub admin: SocketAddr,
}

/// Starts `command(grpc, admin)` on two free 127.0.0.1 ports and waits (at most `within`)
/// until both accept connections. A process that exits before that is started again on new
/// ports, up to a few times; then this panics with its exit status. After `within` the
/// process is returned as it is (the caller's own readiness wait reports what went wrong).
pub fn spawn_listening(
    mut command: impl FnMut(SocketAddr, SocketAddr) -> Command,
    within: Duration,
) -> Listening {
    let mut exits: Vec<ExitStatus> = Vec::new();
    for _ in 0..ATTEMPTS {
        let grpc = free_addr();
        let admin = loop {
            let admin = free_addr();
            if admin != grpc {
                break admin;
            }
        };
        let mut child = command(grpc, admin).spawn().expect("start the process");
        let until = Instant::now() + within;
        let exited = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Some(status);
            }
            let listening = |addr| TcpStream::connect_timeout(&addr, Duration::from_secs(1));
            if listening(grpc).is_ok() && listening(admin).is_ok() {
                // Someone listens there: the process itself, or another listener that took a
                // port first (then the process exits soon, and the loop sees it).
                match holds_listeners(child.id(), [grpc.port(), admin.port()]) {
                    Some(true) => break None,
                    Some(false) => {}
                    None => {
                        // No /proc to ask: a process that lost a port exits at once, so
                        // look again after a moment.
                        std::thread::sleep(Duration::from_millis(100));
                        match child.try_wait() {
                            Ok(Some(status)) => break Some(status),
                            _ => break None,
                        }
                    }
                }
            }
            if Instant::now() >= until {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match exited {
            Some(status) => exits.push(status),
            None => return Listening { child, grpc, admin },
        }
    }
    panic!("the process exited before listening, {ATTEMPTS} times on new ports: {exits:?}");
}

/// Whether process `pid` holds a listening TCP socket on each of `ports` (`None` when /proc
/// cannot tell). Answered at once, unlike waiting to see whether the process exits: a test
/// that polls the process right after start (readiness, say) sees it from its first moments.
fn holds_listeners(pid: u32, ports: [u16; 2]) -> Option<bool> {
    use procfs::net::TcpState;
    use procfs::process::{FDTarget, Process};
    let listeners: Vec<(u16, u64)> = procfs::net::tcp()
        .ok()?
        .into_iter()
        .chain(procfs::net::tcp6().unwrap_or_default())
        .filter(|e| e.state == TcpState::Listen)
        .map(|e| (e.local_address.port(), e.inode))
        .filter(|(port, _)| ports.contains(port))
        .collect();
    let held: Vec<u64> = Process::new(i32::try_from(pid).ok()?)
        .ok()?
        .fd()
        .ok()?
        .filter_map(|fd| match fd.ok()?.target {
            FDTarget::Socket(inode) => Some(inode),
            _ => None,
        })
        .collect();
    Some(ports.iter().all(|port| {
        listeners
            .iter()
            .any(|(p, inode)| p == port && held.contains(inode))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that listens on both ports until killed.
    fn listener(grpc: SocketAddr, admin: SocketAddr) -> Command {
        let mut command = Command::new("python3");
        command.args([
            "-c",
            "import socket, sys, time\n\
             for port in sys.argv[1:]:\n\
             \x20   s = socket.socket(); s.bind(('127.0.0.1', int(port))); s.listen(); globals()[port] = s\n\
             time.sleep(60)",
            &grpc.port().to_string(),
            &admin.port().to_string(),
        ]);
        command
    }

    #[test]
    fn a_process_that_exits_before_listening_is_started_again_on_new_ports() {
        let mut given = Vec::new();
        let mut started = spawn_listening(
            |grpc, admin| {
                given.push((grpc, admin));
                if given.len() < 3 {
                    Command::new("false")
                } else {
                    listener(grpc, admin)
                }
            },
            Duration::from_secs(30),
        );
        assert_eq!(given.len(), 3);
        assert_eq!(given[2], (started.grpc, started.admin));
        assert!(TcpStream::connect(started.grpc).is_ok());
        assert!(TcpStream::connect(started.admin).is_ok());
        assert_eq!(started.child.try_wait().expect("status"), None);
        started.child.kill().expect("kill");
        started.child.wait().expect("wait");
    }

    #[test]
    fn the_listeners_are_told_apart_by_their_process() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let other = free_addr().port();
        assert_eq!(
            holds_listeners(std::process::id(), [port, port]),
            Some(true)
        );
        // A port nobody listens on, and a process that holds none of them.
        assert_eq!(
            holds_listeners(std::process::id(), [port, other]),
            Some(false)
        );
        let mut sleeper = Command::new("sleep").arg("30").spawn().expect("sleep");
        assert_eq!(holds_listeners(sleeper.id(), [port, port]), Some(false));
        sleeper.kill().expect("kill");
        sleeper.wait().expect("wait");
    }

    #[test]
    #[should_panic(expected = "exited before listening")]
    fn a_process_that_never_listens_is_reported() {
        spawn_listening(|_, _| Command::new("false"), Duration::from_secs(30));
    }
}
