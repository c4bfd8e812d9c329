//! `ichor-rules crds`: the CustomResourceDefinitions, as the chart ships them.

use super::{EXIT_BAD_INPUT, EXIT_OK, emit};
use crate::runtime::objects::crds_yaml;

pub fn run() -> u8 {
    match crds_yaml() {
        Ok(yaml) => match emit(&yaml) {
            Ok(()) => EXIT_OK,
            Err(code) => code,
        },
        Err(e) => {
            eprintln!("error: cannot write the CRDs: {e}");
            EXIT_BAD_INPUT
        }
    }
}
