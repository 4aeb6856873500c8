"""Selectors the API server refuses, with its exact messages: the unit tests check the local parsers
against this table, and an integration test checks the table against the real (pinned) API server."""

from __future__ import annotations

from typing import Final

_NAME_RULE: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric"
    " character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is"
    " '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_RULE: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must"
    " start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used"
    " for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_PREFIX_RULE: Final = (
    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for"
    r" validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_REQ: Final = "unable to parse requirement: "

LABEL_ERRORS: Final[tuple[tuple[str, str], ...]] = (
    ("a b", _REQ + "found 'b', expected: '=', '!=', '==', 'in', notin'"),
    ("a\x00b=c", _REQ + "found 'b', expected: '=', '!=', '==', 'in', notin'"),
    ("a notin b", _REQ + "found 'b' expected: '('"),
    ("a in (b", _REQ + "found '', expected: ',' or ')'"),
    ("a in (b c)", _REQ + "found 'c', expected: ',' or ')'"),
    ("a in (b,=)", _REQ + "found '=', expected: ',', or identifier"),
    ("a in (=", _REQ + "found '=', expected: ',', ')' or identifier"),
    ("a in (b)c", "found 'c', expected: ',' or 'end of string'"),
    ("a=(b)", _REQ + "found '(', expected: identifier"),
    ("a=b=c", "found '=', expected: ',' or 'end of string'"),
    ("!a=b", "found '=', expected: ',' or 'end of string'"),
    ("=a", "found '=', expected: !, identifier, or 'end of string'"),
    ("a,,b", "found ',', expected: identifier after ','"),
    ("a=b,", "found '', expected: identifier after ','"),
    ("!", _REQ + "found '', expected: identifier"),
    ("!!a", _REQ + "found '!', expected: identifier"),
    ("a>b", _REQ + "for 'Gt', 'Lt' operators, the value must be an integer"),
    ("a>99999999999999999999", _REQ + "for 'Gt', 'Lt' operators, the value must be an integer"),
    ("-a", _REQ + f'invalid label key "-a": name part {_NAME_RULE}'),
    ("a" * 64, _REQ + f'invalid label key "{"a" * 64}": name part must be no more than 63 characters'),
    ("a/", _REQ + f'invalid label key "a/": name part must be non-empty; name part {_NAME_RULE}'),
    ("/b", _REQ + 'invalid label key "/b": prefix part must be non-empty'),
    ("A_/b", _REQ + f'invalid label key "A_/b": {_PREFIX_RULE}'),
    (
        "a/b/c",
        _REQ + f'invalid label key "a/b/c": a qualified name {_NAME_RULE}'
        " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
    ),
    ("a=-b", _REQ + f'invalid label value: "-b": at key: "a": {_VALUE_RULE}'),
    ("a<-5", _REQ + f'invalid label value: "-5": at key: "a": {_VALUE_RULE}'),
    ('a="', _REQ + f'invalid label value: "\\"": at key: "a": {_VALUE_RULE}'),
    ("a=é", _REQ + f'invalid label value: "é": at key: "a": {_VALUE_RULE}'),
    (
        "a=" + "b" * 64,
        _REQ + f'invalid label value: "{"b" * 64}": at key: "a": must be no more than 63 characters',
    ),
)

FIELD_ERRORS: Final[tuple[tuple[str, str, str], ...]] = (
    # (resource, fieldSelector, message)
    ("pods", "spec.nodeName", "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"),
    ("pods", "b=1,a=2,zz", "invalid selector: 'b=1,a=2,zz'; can't understand 'zz'"),
    ("pods", "spec.nodeName=a=b", "invalid field selector: unescaped character in value: 61"),
    ("pods", "spec.nodeName=a\\", "invalid field selector: invalid escape sequence: \\"),
    ("pods", "=x", "field label not supported: "),
    ("pods", "spec.nodeName=a\\x", "invalid field selector: invalid escape sequence: \\x"),
    ("pods", "foo=bar", "field label not supported: foo"),
    ("pods", "zzz=1,aaa=2", "field label not supported: aaa"),
    ("pods", "spec.hostNetwork=true", "field label not supported: spec.hostNetwork"),
    ("pods", "metadata.uid=x", "field label not supported: metadata.uid"),
    ("nodes", "metadata.namespace=x", "field label not supported: metadata.namespace"),
    ("nodes", "spec.nodeName=x", "field label not supported: spec.nodeName"),
    ("secrets", "spec.nodeName=x", "field label not supported: spec.nodeName"),
    ("configmaps", "type=x", '"type" is not a known field selector: only "metadata.name", "metadata.namespace"'),
)

ACCEPTED_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "pods": (
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    ),
    "nodes": ("metadata.name", "spec.unschedulable"),
    "configmaps": ("metadata.name", "metadata.namespace"),
    "secrets": ("metadata.name", "metadata.namespace", "type"),
}
"""Every field each kind can be selected by (the API server refuses any other)."""
