//! The bundled SQLite is built with what the gateway uses and nothing else (LIBSQLITE3_FLAGS in
//! .cargo/config.toml; README, "Design notes"): FTS5 for search, none of the extensions
//! libsqlite3-sys turns on for everyone. Losing the flags (the file removed, a build that does
//! not read it) would silently put ~180 KB back into every binary; this says so.

fn compile_options() -> Vec<String> {
    let conn = rusqlite::Connection::open_in_memory().expect("an in-memory database");
    let mut stmt = conn.prepare("PRAGMA compile_options").unwrap();
    let options = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    options
}

#[test]
fn sqlite_is_built_with_fts5_and_without_the_unused_extensions() {
    let options = compile_options();
    let has = |o: &str| options.iter().any(|x| x == o);
    assert!(has("ENABLE_FTS5"), "search needs FTS5: {options:?}");
    for omitted in [
        "OMIT_LOAD_EXTENSION",
        "OMIT_JSON",
        "OMIT_DEPRECATED",
        "OMIT_SHARED_CACHE",
        "OMIT_PROGRESS_CALLBACK",
    ] {
        assert!(has(omitted), "{omitted} missing: {options:?}");
    }
    for unused in [
        "ENABLE_FTS3",
        "ENABLE_RTREE",
        "ENABLE_DBSTAT_VTAB",
        "ENABLE_STAT4",
        "SOUNDEX",
        "ENABLE_COLUMN_METADATA",
    ] {
        assert!(!has(unused), "{unused} is built in: {options:?}");
    }
}

#[test]
fn the_omitted_sql_functions_are_refused_and_fts5_works() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    let err = conn
        .query_row("SELECT json('{}')", [], |r| r.get::<_, String>(0))
        .unwrap_err();
    assert!(err.to_string().contains("no such function"), "{err}");
    let err = conn
        .execute_batch("CREATE VIRTUAL TABLE t3 USING fts3(body)")
        .unwrap_err();
    assert!(err.to_string().contains("no such module"), "{err}");
    conn.execute_batch(
        "CREATE VIRTUAL TABLE t5 USING fts5(body); INSERT INTO t5 VALUES ('otter lantern');",
    )
    .unwrap();
    let hits: i64 = conn
        .query_row("SELECT count(*) FROM t5 WHERE t5 MATCH 'lant*'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(hits, 1);
}
