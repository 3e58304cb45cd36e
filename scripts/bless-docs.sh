#!/usr/bin/env bash
# Regenerate the committed docs that tests keep fresh (docs/state-machine.md).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBTRAIL_BLESS=1 cargo test -p jobtrail-core --test state_machine state_machine_doc_is_fresh
