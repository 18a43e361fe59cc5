//! A host root with a finished bootstrap's install record and nothing else: enough for
//! `nodeward daemon` to start (the node is there) without a real node.

use serde_json::json;
use std::path::Path;

/// Writes the install record of a finished bootstrap of machine `w1` beneath `root`.
pub fn finished_node(root: &Path) {
    let state = root.join(nodeward_node_config::layout::STATE_DIR);
    std::fs::create_dir_all(&state).expect("state dir");
    std::fs::write(
        state.join("install-record.json"),
        json!({
            "schema": 1,
            "machineName": "w1",
            "configFingerprint": "f".repeat(64),
            "version": "v1",
            "checkpoint": "complete",
        })
        .to_string(),
    )
    .expect("record");
}
