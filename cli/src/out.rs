//! Standard output for the commands: `outln!` is `println!` that ends the process quietly
//! (exit status 0) when the reader went away (`thunder-cli query ... | head -1`), where
//! `println!` would panic with exit status 101.

use std::io::Write as _;

/// `println!` to standard output, ending the process quietly on a closed pipe (see `line`).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

/// Writes `args` and a newline to standard output. A closed pipe ends the process with exit
/// status 0 (the reader has what it wanted); another write error ends it with status 1 and a
/// message on standard error.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(args)
        .and_then(|()| stdout.write_all(b"\n"));
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("thunder-cli: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}
