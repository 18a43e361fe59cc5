//! Writes the CustomResourceDefinitions generated from the API types to `deploy/crds/`:
//! `cargo run -p nodeward-api --example crds`. Run it after changing a type in `api/src`;
//! `api/tests/crds.rs` fails until the files agree with the types.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    // The workspace root is the api crate's parent.
    let Some(root) = Path::new(env!("CARGO_MANIFEST_DIR")).parent() else {
        eprintln!("the api crate has no parent directory");
        return ExitCode::FAILURE;
    };
    let dir = root.join("deploy/crds");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("{}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for file in nodeward_api::crd::all() {
        let path = dir.join(&file.file_name);
        let text = match file.render() {
            Ok(text) => text,
            Err(e) => {
                eprintln!("{}: cannot render: {e}", file.file_name);
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("{}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
