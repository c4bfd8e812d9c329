//! `ichor-rules crds`: the CustomResourceDefinitions, as the chart ships them.

use super::{EXIT_BAD_INPUT, EXIT_OK};
use crate::runtime::objects::crds_yaml;

pub fn run() -> u8 {
    match crds_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: cannot write the CRDs: {e}");
            EXIT_BAD_INPUT
        }
    }
}
