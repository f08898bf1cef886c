//! The keyring's rules, as upstream's credentialprovider tests write them.

use super::*;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn cred(user: &str, password: &str) -> Credential {
    Credential {
        username: user.into(),
        password: password.into(),
        ..Default::default()
    }
}

fn keyring_of(json: &str) -> Keyring {
    let mut k = Keyring::default();
    k.add(&parse_dockercfg(json.as_bytes()).unwrap());
    k
}

/// One entry under `key` with user foo, password bar (as upstream's tests build them).
fn single(key: &str) -> Keyring {
    keyring_of(
        &serde_json::json!({key: {"email": "foo@bar.baz", "auth": b64("foo:bar")}}).to_string(),
    )
}

#[test]
fn urls_match_as_upstream() {
    let cases = [
        ("*.kubernetes.io", "prefix.kubernetes.io", true),
        ("prefix.*.io", "prefix.kubernetes.io", true),
        ("prefix.kubernetes.*", "prefix.kubernetes.io", true),
        ("*-good.kubernetes.io", "prefix-good.kubernetes.io", true),
        ("*.kubernetes.io/blah", "prefix.kubernetes.io/blah", true),
        ("prefix.*.io/foo", "prefix.kubernetes.io/foo/bar", true),
        (
            "*.kubernetes.io:1111/blah",
            "prefix.kubernetes.io:1111/blah",
            true,
        ),
        (
            "prefix.*.io:1111/foo",
            "prefix.kubernetes.io:1111/foo/bar",
            true,
        ),
        ("*.kubernetes.io", "kubernetes.io", false),
        ("*.*.kubernetes.io", "prefix.kubernetes.io", false),
        ("*.*.kubernetes.io", "kubernetes.io", false),
        ("kubernetes.io", "kubernetes.com", false),
        ("k*.io", "quay.io", false),
        (
            "*.kubernetes.io:1234/blah",
            "prefix.kubernetes.io:1111/blah",
            false,
        ),
        (
            "prefix.*.io/foo",
            "prefix.kubernetes.io:1111/foo/bar",
            false,
        ),
        // Beyond upstream's table: classes, a malformed glob, and a '?', which starts
        // the URL's query (as Go parses it) and so never reaches the glob.
        ("registry-[0-9].example.com", "registry-7.example.com", true),
        (
            "registry-[^0-9].example.com",
            "registry-7.example.com",
            false,
        ),
        ("r?.example.com", "r1.example.com", false),
        ("r[.example.com", "r[.example.com", false),
        ("127.0.0.1:5000", "127.0.0.1:5000/private/busybox", true),
        ("127.0.0.1:5000", "127.0.0.1/private/busybox", false),
        ("127.0.0.1", "127.0.0.1:5000/private/busybox", false),
    ];
    for (glob, target, want) in cases {
        assert_eq!(urls_match(glob, target), want, "{glob} vs {target}");
    }
}

#[test]
fn labels_glob_as_go_filepath_match() {
    let m = |p: &str, n: &str| {
        let p: Vec<char> = p.chars().collect();
        let n: Vec<char> = n.chars().collect();
        glob_match(&p, &n)
    };
    assert!(m("r?", "r1") && !m("r?", "r") && !m("r?", "r12"));
    assert!(m("*", "") && m("a*b*c", "axxbyyc") && !m("a*b*c", "axxbyy"));
    assert!(m("[a-c]x", "bx") && !m("[a-c]x", "dx") && m("[^a-c]x", "dx"));
    assert!(m("\\*", "*") && !m("\\*", "a"));
    assert!(!m("[", "[") && !m("[]a]", "]") && !m("[a-]", "a"));
}

#[test]
fn keyring_globs_schemes_ports_and_paths_as_upstream() {
    let hits = [
        ("https://hello.kubernetes.io", "hello.kubernetes.io"),
        ("https://*.docker.io", "prefix.docker.io"),
        ("https://prefix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.*", "prefix.docker.io"),
        ("https://*.docker.io/path", "prefix.docker.io/path"),
        ("https://prefix.*.io/path", "prefix.docker.io/path/subpath"),
        ("https://prefix.docker.*/path", "prefix.docker.io/path"),
        ("https://*.docker.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.*.io:8888", "prefix.docker.io:8888"),
        ("https://prefix.docker.*:8888", "prefix.docker.io:8888"),
        (
            "https://*.docker.io/path:1111",
            "prefix.docker.io/path:1111",
        ),
        ("https://*.docker.io/v1/", "prefix.docker.io/path:1111"),
        ("https://*.docker.io/v2/", "prefix.docker.io/path:1111"),
        (
            "https://prefix.docker.*/path:1111",
            "prefix.docker.io/path:1111",
        ),
        ("prefix.docker.io:1111", "prefix.docker.io:1111/path"),
        ("*.docker.io:1111", "prefix.docker.io:1111/path"),
        (
            "http://127.0.0.1:5000/private",
            "127.0.0.1:5000/private/busybox",
        ),
    ];
    for (key, target) in hits {
        let found = single(key).lookup(&format!("{target}/foo/bar"));
        assert_eq!(
            found,
            vec![cred("foo", "bar")],
            "{key} should cover {target}"
        );
    }
    let misses = [
        ("https://hello.kubernetes.io", "world.mesos.org/foo/bar"),
        ("https://*.docker.com", "prefix.docker.io"),
        ("https://suffix.*.io", "prefix.docker.io"),
        ("https://prefix.docker.c*", "prefix.docker.io"),
        (
            "https://prefix.*.io/path:1111",
            "prefix.docker.io/path/subpath:1111",
        ),
        ("suffix.*.io", "prefix.docker.io"),
        ("https://index.docker.io/v1/", "world.mesos.org/foo/bar"),
        (
            "http://127.0.0.1:5000/other",
            "127.0.0.1:5000/private/busybox",
        ),
    ];
    for (key, target) in misses {
        let found = single(key).lookup(&format!("{target}/foo/bar"));
        assert!(found.is_empty(), "{key} should not cover {target}");
    }
}

#[test]
fn docker_hub_credentials_serve_unqualified_and_qualified_hub_images() {
    let hub = single("https://index.docker.io/v1/");
    for image in [
        "google/docker-registry",
        "jenkins",
        "index.docker.io/v1//google/docker-registry",
        "docker.io/library/busybox",
    ] {
        assert_eq!(hub.lookup(image), vec![cred("foo", "bar")], "{image}");
    }
    // Through the normalization pull names get first.
    let repo = crate::images::image_ref::parse_normalized_named("busybox:1.36")
        .unwrap()
        .repository();
    assert_eq!(hub.lookup(&repo), vec![cred("foo", "bar")]);
    // A key of "docker.io" matches normalized names by URL.
    let docker_io = single("docker.io");
    assert_eq!(docker_io.lookup(&repo), vec![cred("foo", "bar")]);
    assert!(docker_io.lookup("quay.io/x/y").is_empty());
}

#[test]
fn is_default_registry_match_as_upstream() {
    for (image, want) in [
        ("foo/bar", true),
        ("docker.io/foo/bar", true),
        ("index.docker.io/foo/bar", true),
        ("foo", true),
        ("", false),
        ("registry.tld/foo/bar", false),
        ("registry:5000/foo/bar", false),
        ("myhostdocker.io/foo/bar", false),
    ] {
        assert_eq!(is_default_registry_match(image), want, "{image:?}");
    }
}

#[test]
fn more_specific_keys_come_first() {
    let ada = cred("ada", "smash");
    let grace = cred("grace", "squash");
    let mut dk = Keyring::default();
    dk.add(&vec![
        ("bar.example.com/pong".into(), grace.clone()),
        ("bar.example.com".into(), ada.clone()),
    ]);
    let cases: [(&str, Vec<Credential>); 7] = [
        ("bar.example.com", vec![ada.clone()]),
        ("bar.example.com/pong", vec![grace.clone(), ada.clone()]),
        ("bar.example.com/ping", vec![ada.clone()]),
        ("bar.example.com/pongz", vec![grace.clone(), ada.clone()]),
        (
            "bar.example.com/pong/pang",
            vec![grace.clone(), ada.clone()],
        ),
        ("example.com", vec![]),
        ("foo.example.com", vec![]),
    ];
    for (image, want) in cases {
        assert_eq!(dk.lookup(image), want, "{image}");
    }
    // A scheme and a /v1/ path stand for the host (upstream issue 3797).
    let mut dk = Keyring::default();
    dk.add(&vec![(
        "https://quay.io/v1/".into(),
        cred("rex", "tiny arms"),
    )]);
    for image in ["quay.io", "quay.io/foo", "quay.io/foo/bar"] {
        assert_eq!(dk.lookup(image), vec![cred("rex", "tiny arms")]);
    }
}

#[test]
fn several_configs_add_up_in_order() {
    let mut dk = Keyring::default();
    dk.add(&vec![("registry.example.com".into(), cred("one", "1"))]);
    dk.add(&vec![("registry.example.com".into(), cred("two", "2"))]);
    assert_eq!(
        dk.lookup("registry.example.com/app"),
        vec![cred("one", "1"), cred("two", "2")]
    );
}

#[test]
fn entries_parse_as_go_decodes_them() {
    // auth wins over username/password; field names in any case; padded or not.
    let cfg = parse_dockercfg(
        serde_json::json!({
            "a.example.com": {"username": "x", "password": "y", "auth": b64("user:pa:ss")},
            "b.example.com": {"Username": "u", "PASSWORD": "p"},
            "c.example.com": {"auth": b64("ab:c").trim_end_matches('=')},
            "d.example.com": {"identitytoken": "id-tok", "registrytoken": "reg-tok"},
            "e.example.com": null,
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let by_key: HashMap<_, _> = cfg.into_iter().collect();
    assert_eq!(by_key["a.example.com"], cred("user", "pa:ss"));
    assert_eq!(by_key["b.example.com"], cred("u", "p"));
    assert_eq!(by_key["c.example.com"], cred("ab", "c"));
    assert_eq!(by_key["d.example.com"].identity_token, "id-tok");
    assert_eq!(by_key["d.example.com"].registry_token, "reg-tok");
    assert_eq!(by_key["e.example.com"], Credential::default());

    let json = parse_dockerconfigjson(
        br#"{"auths": {"r.example.com": {"auth": "Zm9vOmJhcg=="}}, "HttpHeaders": {}}"#,
    )
    .unwrap();
    assert_eq!(json, vec![("r.example.com".into(), cred("foo", "bar"))]);
    assert!(parse_dockerconfigjson(b"{}").unwrap().is_empty());
    assert!(parse_dockerconfigjson(b"null").unwrap().is_empty());

    for bad in [
        r#"{"r": {"auth": "bm9jb2xvbg=="}}"#, // "nocolon"
        r#"{"r": {"auth": "!!!"}}"#,
        r#"{"r": {"username": 5}}"#,
        r#"{"r": "x"}"#,
        r#"[]"#,
        r#"{"#,
    ] {
        assert!(parse_dockercfg(bad.as_bytes()).is_err(), "{bad}");
    }
    assert!(parse_dockerconfigjson(br#"{"auths": []}"#).is_err());
}

#[test]
fn errors_and_debug_never_show_a_secret() {
    let err = parse_dockercfg(br#"{"r": {"auth": "aHVudGVyMg=="}}"#).unwrap_err();
    assert!(
        !err.contains("aHVudGVyMg") && !err.contains("hunter2"),
        "{err}"
    );
    let c = Credential {
        username: "ada".into(),
        password: "hunter2".into(),
        identity_token: "tok-123".into(),
        registry_token: String::new(),
    };
    let shown = format!("{c:?}");
    assert!(shown.contains("ada"), "{shown}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("tok-123"),
        "{shown}"
    );
    let cri = c.to_cri();
    assert_eq!(
        (cri.username.as_str(), cri.password.as_str()),
        ("ada", "hunter2")
    );
    assert!(cri.auth.is_empty() && cri.server_address.is_empty());
    assert_eq!(cri.identity_token, "tok-123");
}

#[test]
fn invalid_keys_are_ignored() {
    let mut dk = Keyring::default();
    dk.add(&vec![
        ("https://bad host".into(), cred("x", "y")),
        ("bad.example.com:port".into(), cred("x", "y")),
        ("good.example.com".into(), cred("g", "h")),
    ]);
    assert_eq!(dk.index, vec!["good.example.com".to_string()]);
}

fn dockerconfigjson_secret(ty: &str, key: &str, body: &str) -> Secret {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "regcred"},
        "type": ty,
        "data": {key: b64(body)},
    }))
    .unwrap()
}

#[test]
fn pull_secrets_of_both_types_and_nothing_else() {
    let json = dockerconfigjson_secret(
        "kubernetes.io/dockerconfigjson",
        ".dockerconfigjson",
        r#"{"auths": {"r.example.com": {"username": "a", "password": "b"}}}"#,
    );
    let legacy = dockerconfigjson_secret(
        "kubernetes.io/dockercfg",
        ".dockercfg",
        r#"{"r.example.com": {"username": "c", "password": "d"}}"#,
    );
    // The right key under the wrong type is ignored, as upstream ignores it.
    let mistyped = dockerconfigjson_secret(
        "Opaque",
        ".dockerconfigjson",
        r#"{"auths": {"r.example.com": {"username": "e", "password": "f"}}}"#,
    );
    let keyring = secrets_keyring(&[json, legacy, mistyped]).unwrap();
    assert_eq!(
        keyring.lookup("r.example.com/app"),
        vec![cred("a", "b"), cred("c", "d")]
    );
    let broken = dockerconfigjson_secret(
        "kubernetes.io/dockerconfigjson",
        ".dockerconfigjson",
        "not json",
    );
    let err = secrets_keyring(&[broken]).unwrap_err();
    assert!(err.contains("regcred"), "{err}");
}

#[test]
fn the_node_file_is_found_in_upstream_order() {
    let root = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let paths = node_search_paths(root.path(), Some(cwd.path()), Some(home.path()));
    let names: Vec<(PathBuf, Format)> = vec![
        (root.path().join("config.json"), Format::ConfigJson),
        (cwd.path().join("config.json"), Format::ConfigJson),
        (home.path().join(".docker/config.json"), Format::ConfigJson),
        ("/.docker/config.json".into(), Format::ConfigJson),
        (root.path().join(".dockercfg"), Format::Dockercfg),
        (cwd.path().join(".dockercfg"), Format::Dockercfg),
        (home.path().join(".dockercfg"), Format::Dockercfg),
        ("/.dockercfg".into(), Format::Dockercfg),
    ];
    assert_eq!(paths, names);
    // Only the temp dirs: the host's own files play no part in this test.
    let paths: Vec<_> = paths
        .into_iter()
        .filter(|(p, _)| !p.starts_with("/.docker") && p != Path::new("/.dockercfg"))
        .collect();
    let entry =
        |user: &str| format!(r#"{{"r.example.com": {{"username": "{user}", "password": "p"}}}}"#);
    let write = |p: PathBuf, s: String| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    };
    assert!(read_node_config(&paths).is_none());
    // A .dockercfg in the root dir, a config.json in $HOME/.docker: config.json wins.
    write(root.path().join(".dockercfg"), entry("root-dockercfg"));
    write(
        home.path().join(".docker/config.json"),
        format!(r#"{{"auths": {}}}"#, entry("home-json")),
    );
    let (found, cfg) = read_node_config(&paths).unwrap();
    assert_eq!(found, home.path().join(".docker/config.json"));
    assert_eq!(cfg[0].1.username, "home-json");
    // The working directory comes before $HOME; an invalid file is skipped.
    write(cwd.path().join("config.json"), "{broken".into());
    assert_eq!(
        read_node_config(&paths).unwrap().1[0].1.username,
        "home-json"
    );
    write(
        cwd.path().join("config.json"),
        format!(r#"{{"auths": {}}}"#, entry("cwd-json")),
    );
    assert_eq!(
        read_node_config(&paths).unwrap().1[0].1.username,
        "cwd-json"
    );
    // The root dir first of all; one file only, never merged.
    write(
        root.path().join("config.json"),
        format!(r#"{{"auths": {}}}"#, entry("root-json")),
    );
    let (found, cfg) = read_node_config(&paths).unwrap();
    assert_eq!(found, root.path().join("config.json"));
    assert_eq!(cfg.len(), 1);
    assert_eq!(cfg[0].1.username, "root-json");
    // With no config.json anywhere, the first .dockercfg.
    for p in [
        root.path().join("config.json"),
        cwd.path().join("config.json"),
        home.path().join(".docker/config.json"),
    ] {
        std::fs::remove_file(p).unwrap();
    }
    write(home.path().join(".dockercfg"), entry("home-dockercfg"));
    assert_eq!(
        read_node_config(&paths).unwrap().1[0].1.username,
        "root-dockercfg"
    );
    std::fs::remove_file(root.path().join(".dockercfg")).unwrap();
    assert_eq!(
        read_node_config(&paths).unwrap().1[0].1.username,
        "home-dockercfg"
    );
}
