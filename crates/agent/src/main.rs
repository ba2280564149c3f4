//! `inplace-agent`: the node agent alone, the binary every node downloads. The same agent, flags and
//! environment as `inplace-updater agent`, without the server's code (see [`inplace_agent::cli`]).

fn main() {
    std::process::exit(inplace_agent::cli::main())
}
