"""dpone.credentials.redaction: every DSN form's secret is found, registered and masked; messages stay useful."""

from __future__ import annotations

import json
import uuid
from urllib.parse import quote

import pytest
from dpone.credentials import redaction
from dpone.credentials.redaction import describe_dsn, has_credentials, redact_document, redact_text


def _secret() -> str:
    return "Zk" + uuid.uuid4().hex[:12]


#: form -> DSN with the secret planted (the password is the secret plus what the form adds)
FORMS = {
    "url_userinfo": lambda s: f"postgresql://etl:{s}@db.example:5432/app",
    "url_query_password": lambda s: f"postgresql://etl@db.example:5432/app?password={s}",
    "url_query_sslpassword": lambda s: f"postgresql://etl@db/app?sslmode=require&sslpassword={s}",
    "url_encoded_key": lambda s: f"postgresql://etl@db/app?pass%77ord={s}",
    "percent_encoded": lambda s: f"postgresql://etl:{quote(s + '/@:;', safe='')}@db/app",
    "percent_malformed": lambda s: f"postgresql://etl:{s}%zz@db/app",
    "libpq_keyword_value": lambda s: f"host=db port=5432 password={s} dbname=app",
    "libpq_quoted": lambda s: f"host=db password='{s} x\\'y' dbname=app",
    "odbc_PWD_braced": lambda s: f"odbc://DRIVER={{FreeTDS}};SERVER=db;UID=u;PWD={{{s};}}}}x}};",
    "odbc_Pwd": lambda s: f"odbc://DRIVER={{FreeTDS}};SERVER=db;UID=u;Pwd={s};DATABASE=app",
    "mssql_url": lambda s: f"mssql://sa:{s}@db:1433/app?TrustServerCertificate=yes",
    "ipv6_malformed": lambda s: f"postgresql://u:{s}@[::1/app",
    "password_with_slash": lambda s: f"postgresql://u:{s}/x@db/app",
}


#: the whole password of the forms that add to the planted secret
PASSWORDS = {
    "percent_encoded": lambda s: s + "/@:;",
    "percent_malformed": lambda s: s + "%zz",
    "libpq_quoted": lambda s: s + " x'y",
    "odbc_PWD_braced": lambda s: s + ";}x",
    "password_with_slash": lambda s: s + "/x",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_registered_dsn_leaves_no_trace_of_its_secret(form: str) -> None:
    secret = _secret()
    dsn = FORMS[form](secret)
    redaction.register_dsn(dsn)
    password = PASSWORDS.get(form, lambda s: s)(secret)
    echoes = [
        dsn,
        f"could not connect ({dsn})",
        repr(dsn),
        json.dumps({"dsn": dsn}),
        f'invalid percent-encoded token: "{password}"',
        f"password authentication failed: {password!r}",
        f"password={password}",
        json.dumps(password),
    ]
    for text in echoes:
        assert secret not in redact_text(text), (form, text)
    assert secret not in describe_dsn(dsn)
    assert secret not in json.dumps(redact_document({"a": [dsn, {dsn: 1}]}))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_pattern_scrubbing_alone_masks_every_form(form: str) -> None:
    """A DSN dpone never resolved (a copy in a driver message) is still masked by its shape."""
    secret = _secret()
    dsn = FORMS[form](secret)
    assert secret not in redact_text(f"error near {dsn} here"), form


def test_short_secrets_are_masked_as_whole_tokens_only() -> None:
    redaction.register_dsn("postgresql://u:pq@db/app")
    assert redact_text("the pq password pq") == "the *** password ***"
    assert redact_text("pqrs stays") == "pqrs stays"


def test_driver_echoes_of_settings_are_masked() -> None:
    for text in (
        'invalid sslmode value: "Zsecret1"',
        'invalid connection option "Zsecret1"',
        'invalid integer value "Zsecret1" for connection option "port"',
        'invalid value for parameter "statement_timeout": "Zsecret1"',
        'missing "=" after "Zsecret1" in connection info string',
    ):
        assert "Zsecret1" not in redact_text(text)


def test_messages_keep_what_helps() -> None:
    text = 'connection to server at "127.0.0.1", port 1 failed: Connection refused'
    assert redact_text(text) == text
    assert redact_text('relation "s.orders" does not exist') == 'relation "s.orders" does not exist'
    assert describe_dsn("postgresql://etl:pw@db.example:5432/app?sslmode=require") == (
        "postgresql://db.example:5432/app"
    )
    assert describe_dsn("odbc://DRIVER={x};SERVER=db,1433;PWD={p}") == "odbc://SERVER=db,1433"
    assert describe_dsn("host=db password=x") == "(a DSN that is not a URL)"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("postgresql://app:s3cret@db/app", True),
        ("postgresql://app@db/app?password=s3cret", True),
        ("host=db password=s3cret", True),
        ("DRIVER={x};SERVER=db;PWD={s3cret}", True),
        ("Server=db;Pwd=s3cret", True),
        ("postgresql://app@db/app", False),
        ("https://example.com/path?q=1", False),
        ("INFO", False),
        ("-Xmx1g -Dfile.encoding=UTF-8", False),
        # userinfo without a scheme, as the docs name it ("user:password@")
        ("etl:s3cret@db.example.com", True),
        ("etl:s3cret@db.example.com:5432/app", True),
        ("//etl:s3cret@db/app", True),
        ("etl@db.example.com", False),
        ("image:1.0@sha256:0123abcd", False),
        ("registry.example:5000/image:1.0@sha256:0123abcd", False),
        ("a:b", False),
    ],
)
def test_has_credentials(value: str, expected: bool) -> None:
    assert has_credentials(value) is expected


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ('{"conn_type": "postgres", "login": "etl", "password": "pw1"}', ["password"]),
        ('{"type": "http", "auth": {"type": "api_key", "apiKey": "k1"}}', ["apiKey"]),
        ('{"Authorization": "Bearer t1", "X-Trace": "on"}', ["Authorization"]),
        ('{"extra": {"uri": "postgresql://u:pw2@db/x"}}', ["uri"]),
        ('[{"password": "pw3"}]', []),  # not an object: a value, not a configuration
        ('{"login": "etl", "password": "", "partition_key": "day", "BYPASS": "on"}', []),
        ('{"password": "pw4"', []),  # not JSON
        ("password=pw5", []),  # a libpq string: has_credentials reads that form
        ('{"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"token": "deep"}}}}}}}}}', []),
    ],
)
def test_json_secrets_names_the_fields_that_hold_one(text: str, fields: list[str]) -> None:
    assert [name for name, _ in redaction.json_secrets(text)] == fields


def test_an_openlineage_auth_object_is_redacted_from_every_output() -> None:
    from dpone.observability.exporting import register_exporter_secrets

    key = f"ol-key-{uuid.uuid4().hex}"
    register_exporter_secrets(
        {"OPENLINEAGE__TRANSPORT__AUTH": json.dumps({"type": "api_key", "apiKey": key})}
    )
    assert key not in redact_text(f"the endpoint refused {key}")


#: DSNs libpq refuses, each quoting a fragment that holds a quote of its own: the fragment is a
#: piece of the password (tagged Zk<n>), and no part of it, before or after its quotes, may show
QUOTED_FRAGMENTS = {
    "userinfo_quote_space": 'postgresql://u:Zk1front"Zk1tail end@db:5432/app',
    "query_quote_space": 'postgresql://u@db/app?password=Zk2front "Zk2tail',
    "query_bad_percent_quote": 'postgresql://u@db/app?password=Zk3front%zz"Zk3tail',
    "keyword_quote": 'host=db password=Zk4front"="Zk4tail" Zk4more',
    "query_key_quote": 'postgresql://u@db/app?Zk5front"Zk5tail=1',
}


@pytest.mark.parametrize("form", sorted(QUOTED_FRAGMENTS))
def test_libpq_parse_errors_hide_fragments_that_hold_quotes(form: str) -> None:
    """libpq quotes the piece it could not read as it is, inner quotes included: masking stops at
    no quote inside it (the real parser's messages, nothing registered)."""
    import psycopg.conninfo
    from dpone.credentials.dsn_settings import postgres_parse_problem

    dsn = QUOTED_FRAGMENTS[form]
    tag = dsn[dsn.index("Zk") : dsn.index("Zk") + 3]
    with pytest.raises(psycopg.ProgrammingError) as refused:
        psycopg.conninfo.conninfo_to_dict(dsn)
    assert tag in str(refused.value)  # the driver's own text quotes the secret: it must be hidden
    shown = postgres_parse_problem(refused.value)
    assert tag not in shown and '"***"' in shown, shown


def test_libpq_own_quoted_words_stay_readable() -> None:
    mask = redaction.mask_quoted
    assert mask('missing "=" after "pw" in connection info string') == (
        'missing "=" after "***" in connection info string'
    )
    assert mask('looking for matching "]" in IPv6 host address in URI: "x"y"') == (
        'looking for matching "]" in IPv6 host address in URI: "***"'
    )
    assert mask('a lone quote "then the rest') == 'a lone quote "***"'
