"""Schemathesis hooks for .ci/run (loaded through SCHEMATHESIS_HOOKS).

`POST /agent/v1/poll` is a long-poll: a valid body with `waitSeconds: 25` is answered after 25 s (capped at
30) when there is nothing to hand out, which is the right behaviour and would make every such generated
case cost that long. Generated waits are therefore capped at 0 seconds so the run stays within its
budget; the waiting itself is tested in Rust (src/dispatch/tests.rs, crates/agent/tests/integration/pull_loop.rs).
Only non-negative integers are touched: negative numbers, floats and other types still reach the server
and must be refused with 400.
"""

import schemathesis


@schemathesis.hook.apply_to(path="/agent/v1/poll")
def map_body(context, body):
    if isinstance(body, dict):
        wait = body.get("waitSeconds")
        if isinstance(wait, int) and not isinstance(wait, bool) and wait > 0:
            body["waitSeconds"] = 0
    return body
