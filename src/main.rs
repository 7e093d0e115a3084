fn main() {
    std::process::exit(rifflefs::cli::main());
}
