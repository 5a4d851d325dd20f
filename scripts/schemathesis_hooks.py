"""Schemathesis hooks for scripts/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS).

A positive test case may carry the optional `x-tenant-id` header or a body `tenantId`. Any UUID
is valid by the schema, but only the API key's own tenant lets the request through (any other is
a documented 403). So that positive cases reach the success paths too, half of the generated
UUIDs (chosen by the UUID itself, so a seed replays identically) are replaced by the demo key's
tenant; the other half keep exercising the 403. Negative cases are left exactly as generated.
"""

from __future__ import annotations

import uuid

import schemathesis

DEMO_TENANT = "00000000-0000-4000-8000-000000000001"


def _own_tenant(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return value
    return DEMO_TENANT if parsed.int % 2 == 0 else value


@schemathesis.hook
def map_case(context, case):
    meta = getattr(case, "meta", None)
    generation = getattr(meta, "generation", None)
    mode = getattr(generation, "mode", None)
    if mode is None or not mode.is_positive:
        return case
    if case.headers:
        for name in list(case.headers):
            if name.lower() == "x-tenant-id":
                case.headers[name] = _own_tenant(case.headers[name])
    if isinstance(case.body, dict) and "tenantId" in case.body:
        case.body["tenantId"] = _own_tenant(case.body["tenantId"])
    return case
