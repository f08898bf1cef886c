//! Image references as upstream's reference tests parse and normalize them.

use super::*;

const SHA256_F: &str = "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";

fn normalized(s: &str) -> Reference {
    parse_normalized_named(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// The cases (31): a registry with a port but no dot stays the domain (it was
/// made `docker.io/localhost:5000/...` by hand before, so image GC did not recognise the
/// sandbox image); an untagged name gets `latest`, as containerd lists it.
#[test]
fn sandbox_images_normalise_as_containerd_lists_them() {
    for (image, want) in [
        ("localhost:5000/pause:3.9", "localhost:5000/pause:3.9"),
        ("pause", "docker.io/library/pause:latest"),
        ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
        ("registry.k8s.io/pause", "registry.k8s.io/pause:latest"),
        ("registry:5000/pause", "registry:5000/pause:latest"),
        ("[::1]:5000/pause:3.9", "[::1]:5000/pause:3.9"),
        ("k8s/pause:3.9", "docker.io/k8s/pause:3.9"),
    ] {
        let r = normalized(image);
        assert_eq!(r.canonical(), want, "{image}");
        assert_eq!(r.docker_ref(), want, "{image}");
    }
}

/// normalize_test.go TestValidateReferenceName: every valid name parses, every invalid
/// one is refused.
#[test]
fn validate_reference_name() {
    for name in [
        "docker/docker",
        "library/debian",
        "debian",
        "docker.io/docker/docker",
        "docker.io/library/debian",
        "docker.io/debian",
        "index.docker.io/docker/docker",
        "index.docker.io/library/debian",
        "index.docker.io/debian",
        "127.0.0.1:5000/docker/docker",
        "127.0.0.1:5000/library/debian",
        "127.0.0.1:5000/debian",
        "192.168.0.1",
        "192.168.0.1:80",
        "192.168.0.1:8/debian",
        "192.168.0.2:25000/debian",
        "thisisthesongthatneverendsitgoesonandonandonthisisthesongthatnev",
        "[fc00::1]:5000/docker",
        "[fc00::1]:5000/docker/docker",
        "[fc00:1:2:3:4:5:6:7]:5000/library/debian",
        // Valid with a domain: no ambiguity with an identifier.
        "docker.io/1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a",
        "Docker/docker",
        "DOCKER/docker",
    ] {
        assert!(parse_normalized_named(name).is_ok(), "{name}");
    }
    for name in [
        "https://github.com/docker/docker",
        "docker/Docker",
        "-docker",
        "-docker/docker",
        "-docker.io/docker/docker",
        "docker///docker",
        "docker.io/docker/Docker",
        "docker.io/docker///docker",
        "[fc00::1]",
        "[fc00::1]:5000",
        "fc00::1:5000/debian",
        "[fe80::1%eth0]:5000/debian",
        "[2001:db8:3:4::192.0.2.33]:5000/debian",
        "1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a",
    ] {
        assert!(parse_normalized_named(name).is_err(), "{name}");
    }
}

/// normalize_test.go TestValidateRemoteName.
#[test]
fn validate_remote_name() {
    for name in [
        "docker/docker",
        "thisisthesongthatneverendsitgoesonandonandonthisisthesongthatnev",
        "docker-rules/docker",
        "docker---rules/docker",
        "doc/docker",
        "d/docker",
        "jess/t",
        "dock__er/docker",
    ] {
        assert!(parse_normalized_named(name).is_ok(), "{name}");
    }
    for name in [
        "docker/Docker",
        "docker///docker",
        "1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a",
        "-docker/docker",
        "docker-/docker",
        "-docker-/docker",
        "____/____",
        "_docker/_docker",
        "dock..er/docker",
        "dock_.er/docker",
        "dock-.er/docker",
        "docker/",
        "this_is_not_a_valid_namespace_because_its_lenth_is_greater_than_255_this_is_not_a_valid_namespace_because_its_lenth_is_greater_than_255_this_is_not_a_valid_namespace_because_its_lenth_is_greater_than_255_this_is_not_a_valid_namespace_because_its_lenth_is_greater_than_255/docker",
    ] {
        assert!(parse_normalized_named(name).is_err(), "{name}");
    }
}

/// normalize_test.go TestParseRepositoryInfo: the familiar, full and ambiguous spelling
/// of each repository give its full name, domain and remote name (the familiar-name
/// check is left out: nothing here familiarizes).
#[test]
fn parse_repository_info() {
    // (remote name, familiar, full, ambiguous, domain)
    for (remote, familiar, full, ambiguous, domain) in [
        (
            "fooo/bar",
            "fooo/bar",
            "docker.io/fooo/bar",
            "index.docker.io/fooo/bar",
            "docker.io",
        ),
        (
            "library/ubuntu",
            "ubuntu",
            "docker.io/library/ubuntu",
            "library/ubuntu",
            "docker.io",
        ),
        (
            "nonlibrary/ubuntu",
            "nonlibrary/ubuntu",
            "docker.io/nonlibrary/ubuntu",
            "",
            "docker.io",
        ),
        (
            "other/library",
            "other/library",
            "docker.io/other/library",
            "",
            "docker.io",
        ),
        (
            "private/moonbase",
            "127.0.0.1:8000/private/moonbase",
            "127.0.0.1:8000/private/moonbase",
            "",
            "127.0.0.1:8000",
        ),
        (
            "privatebase",
            "127.0.0.1:8000/privatebase",
            "127.0.0.1:8000/privatebase",
            "",
            "127.0.0.1:8000",
        ),
        (
            "private/moonbase",
            "example.com/private/moonbase",
            "example.com/private/moonbase",
            "",
            "example.com",
        ),
        (
            "privatebase",
            "example.com/privatebase",
            "example.com/privatebase",
            "",
            "example.com",
        ),
        (
            "private/moonbase",
            "example.com:8000/private/moonbase",
            "example.com:8000/private/moonbase",
            "",
            "example.com:8000",
        ),
        (
            "privatebasee",
            "example.com:8000/privatebasee",
            "example.com:8000/privatebasee",
            "",
            "example.com:8000",
        ),
        (
            "library/ubuntu-12.04-base",
            "ubuntu-12.04-base",
            "docker.io/library/ubuntu-12.04-base",
            "index.docker.io/library/ubuntu-12.04-base",
            "docker.io",
        ),
        (
            "library/foo",
            "foo",
            "docker.io/library/foo",
            "docker.io/foo",
            "docker.io",
        ),
        (
            "library/foo/bar",
            "library/foo/bar",
            "docker.io/library/foo/bar",
            "",
            "docker.io",
        ),
        (
            "store/foo/bar",
            "store/foo/bar",
            "docker.io/store/foo/bar",
            "",
            "docker.io",
        ),
        ("bar", "Foo/bar", "Foo/bar", "", "Foo"),
        ("bar", "FOO/bar", "FOO/bar", "", "FOO"),
    ] {
        for s in [familiar, full, ambiguous] {
            if s.is_empty() {
                continue;
            }
            let r = normalized(s);
            assert_eq!(r.to_string(), full, "{s}");
            assert_eq!(r.repository(), full, "{s}");
            assert_eq!(r.domain, domain, "{s}");
            assert_eq!(r.path, remote, "{s}");
        }
    }
}

/// normalize_test.go TestParseReferenceWithTagAndDigest.
#[test]
fn parse_reference_with_tag_and_digest() {
    let short =
        "busybox:latest@sha256:86e0e091d0da6bde2456dbb48306f3956bbeb2eae1b5b9a43045843f69fe4aaa";
    let r = normalized(short);
    assert_eq!(r.to_string(), format!("docker.io/library/{short}"));
    assert_eq!(r.tag.as_deref(), Some("latest"));
    assert_eq!(
        r.digest.as_deref(),
        Some("sha256:86e0e091d0da6bde2456dbb48306f3956bbeb2eae1b5b9a43045843f69fe4aaa")
    );
}

/// normalize_test.go TestInvalidReferenceComponents (its name check) and
/// TestNormalizedSplitHostname.
#[test]
fn normalized_split_hostname() {
    assert!(parse_normalized_named("-foo").is_err());
    for (input, domain, path) in [
        ("test.com/foo", "test.com", "foo"),
        ("test_com/foo", "docker.io", "test_com/foo"),
        ("docker/migrator", "docker.io", "docker/migrator"),
        ("test.com:8080/foo", "test.com:8080", "foo"),
        ("test-com:8080/foo", "test-com:8080", "foo"),
        ("foo", "docker.io", "library/foo"),
        ("xn--n3h.com/foo", "xn--n3h.com", "foo"),
        ("xn--n3h.com:18080/foo", "xn--n3h.com:18080", "foo"),
        ("docker.io/foo", "docker.io", "library/foo"),
        ("docker.io/library/foo", "docker.io", "library/foo"),
        ("docker.io/library/foo/bar", "docker.io", "library/foo/bar"),
    ] {
        let r = normalized(input);
        assert_eq!(
            (r.domain.as_str(), r.path.as_str()),
            (domain, path),
            "{input}"
        );
    }
}

/// normalize_test.go TestParseAnyReference: the rows `ParseAnyReference` hands to
/// `ParseNormalizedNamed` (not the bare identifier or digest ones).
#[test]
fn parse_any_reference_named_rows() {
    let d = "sha256:dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9c";
    for (input, want) in [
        ("redis", "docker.io/library/redis".to_string()),
        ("redis:latest", "docker.io/library/redis:latest".into()),
        (
            "docker.io/library/redis:latest",
            "docker.io/library/redis:latest".into(),
        ),
        (
            &format!("redis@{d}"),
            format!("docker.io/library/redis@{d}"),
        ),
        (
            &format!("docker.io/library/redis@{d}"),
            format!("docker.io/library/redis@{d}"),
        ),
        ("dmcgowan/myapp", "docker.io/dmcgowan/myapp".into()),
        (
            "dmcgowan/myapp:latest",
            "docker.io/dmcgowan/myapp:latest".into(),
        ),
        (
            "docker.io/mcgowan/myapp:latest",
            "docker.io/mcgowan/myapp:latest".into(),
        ),
        (
            &format!("dmcgowan/myapp@{d}"),
            format!("docker.io/dmcgowan/myapp@{d}"),
        ),
        (
            &format!("docker.io/dmcgowan/myapp@{d}"),
            format!("docker.io/dmcgowan/myapp@{d}"),
        ),
        // 63 hex digits: a name, not an identifier.
        (
            "dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9",
            "docker.io/library/dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9"
                .into(),
        ),
        ("dbcc1", "docker.io/library/dbcc1".into()),
    ] {
        assert_eq!(normalized(input).to_string(), want, "{input}");
    }
}

/// normalize_test.go TestParseDockerRef.
#[test]
fn parse_docker_ref() {
    let d = "sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582";
    for (input, want) in [
        ("busybox", "docker.io/library/busybox:latest".to_string()),
        ("busybox:latest", "docker.io/library/busybox:latest".into()),
        (
            &format!("busybox@{d}"),
            format!("docker.io/library/busybox@{d}"),
        ),
        ("library/busybox", "docker.io/library/busybox:latest".into()),
        (
            "docker.io/busybox",
            "docker.io/library/busybox:latest".into(),
        ),
        (
            "docker.io/library/busybox",
            "docker.io/library/busybox:latest".into(),
        ),
        (
            "docker.io/busybox:latest",
            "docker.io/library/busybox:latest".into(),
        ),
        (
            "library/busybox:latest",
            "docker.io/library/busybox:latest".into(),
        ),
        (
            "docker.io/library/busybox:latest",
            "docker.io/library/busybox:latest".into(),
        ),
        (
            "gcr.io/library/busybox",
            "gcr.io/library/busybox:latest".into(),
        ),
        (
            &format!("gcr.io/library/busybox:latest@{d}"),
            format!("gcr.io/library/busybox@{d}"),
        ),
    ] {
        let got = normalized(input).docker_ref();
        assert_eq!(got, want, "{input}");
        assert!(parse(&got).is_ok(), "{got} parses");
    }
    // TagNameOnly keeps a tag beside a digest.
    assert_eq!(
        normalized(&format!("gcr.io/library/busybox:latest@{d}")).canonical(),
        format!("gcr.io/library/busybox:latest@{d}")
    );
}

/// reference_test.go TestReferenceParse: `Parse` itself, with nothing normalised. The two
/// length rows follow v0.6.0 (distribution/reference#9: the 255-character limit counts
/// the path, not the domain), whose test moved the too-long case to
/// `domain/<256 a>:tag` and made `<128 × a/>a:tag` valid (domain `a`).
/// (input, error, repository, domain, tag, digest)
#[test]
fn reference_parse() {
    type Row = (
        String,
        Option<&'static str>,
        String,
        &'static str,
        &'static str,
        String,
    );
    let ok = |input: &str, repository: &str, domain: &'static str, tag: &'static str| -> Row {
        (
            input.into(),
            None,
            repository.into(),
            domain,
            tag,
            String::new(),
        )
    };
    let err = |input: &str, e: &'static str| -> Row {
        (input.into(), Some(e), String::new(), "", "", String::new())
    };
    let sha512_f = format!("sha512:{}", "f".repeat(128));
    let rows: Vec<Row> = vec![
        ok("test_com", "test_com", "", ""),
        ok("test.com:tag", "test.com", "", "tag"),
        ok("test.com:5000", "test.com", "", "5000"),
        ok("test.com/repo:tag", "test.com/repo", "test.com", "tag"),
        ok("test:5000/repo", "test:5000/repo", "test:5000", ""),
        ok("test:5000/repo:tag", "test:5000/repo", "test:5000", "tag"),
        (
            format!("test:5000/repo@{SHA256_F}"),
            None,
            "test:5000/repo".into(),
            "test:5000",
            "",
            SHA256_F.into(),
        ),
        (
            format!("test:5000/repo:tag@{SHA256_F}"),
            None,
            "test:5000/repo".into(),
            "test:5000",
            "tag",
            SHA256_F.into(),
        ),
        err("", NAME_EMPTY),
        err(":justtag", INVALID_FORMAT),
        err(&format!("@{SHA256_F}"), INVALID_FORMAT),
        // go-digest's ErrDigestInvalidLength, the same error as ErrDigestInvalidFormat.
        err(&format!("repo@sha256:{}", "f".repeat(34)), DIGEST_INVALID),
        err(
            &format!("validname@invaliddigest:{}", "f".repeat(64)),
            DIGEST_UNSUPPORTED,
        ),
        err("Uppercase:tag", NAME_UPPERCASE),
        // Upstream's FIXME: "Uppercase" is taken for a domain here, so this passes.
        ok(
            "Uppercase/lowercase:tag",
            "Uppercase/lowercase",
            "Uppercase",
            "tag",
        ),
        err("test:5000/Uppercase/lowercase:tag", NAME_UPPERCASE),
        ok("lowercase:Uppercase", "lowercase", "", "Uppercase"),
        err(&format!("domain/{}:tag", "a".repeat(256)), NAME_TOO_LONG),
        ok(
            &format!("{}a:tag", "a/".repeat(128)),
            &format!("{}a", "a/".repeat(128)),
            "a",
            "tag",
        ),
        ok(
            &format!("{}a:tag-puts-this-over-max", "a/".repeat(127)),
            &format!("{}a", "a/".repeat(127)),
            "a",
            "tag-puts-this-over-max",
        ),
        err("aa/asdf$$^/aa", INVALID_FORMAT),
        ok(
            "sub-dom1.foo.com/bar/baz/quux",
            "sub-dom1.foo.com/bar/baz/quux",
            "sub-dom1.foo.com",
            "",
        ),
        ok(
            "sub-dom1.foo.com/bar/baz/quux:some-long-tag",
            "sub-dom1.foo.com/bar/baz/quux",
            "sub-dom1.foo.com",
            "some-long-tag",
        ),
        ok(
            "b.gcr.io/test.example.com/my-app:test.example.com",
            "b.gcr.io/test.example.com/my-app",
            "b.gcr.io",
            "test.example.com",
        ),
        ok(
            "xn--n3h.com/myimage:xn--n3h.com",
            "xn--n3h.com/myimage",
            "xn--n3h.com",
            "xn--n3h.com",
        ),
        (
            format!("xn--7o8h.com/myimage:xn--7o8h.com@{sha512_f}"),
            None,
            "xn--7o8h.com/myimage".into(),
            "xn--7o8h.com",
            "xn--7o8h.com",
            sha512_f.clone(),
        ),
        ok("foo_bar.com:8080", "foo_bar.com", "", "8080"),
        ok("foo/foo_bar.com:8080", "foo/foo_bar.com", "foo", "8080"),
        ok("192.168.1.1", "192.168.1.1", "", ""),
        ok("192.168.1.1:tag", "192.168.1.1", "", "tag"),
        ok("192.168.1.1:5000", "192.168.1.1", "", "5000"),
        ok("192.168.1.1/repo", "192.168.1.1/repo", "192.168.1.1", ""),
        ok(
            "192.168.1.1:5000/repo",
            "192.168.1.1:5000/repo",
            "192.168.1.1:5000",
            "",
        ),
        ok(
            "192.168.1.1:5000/repo:5050",
            "192.168.1.1:5000/repo",
            "192.168.1.1:5000",
            "5050",
        ),
        err("[2001:db8::1]", INVALID_FORMAT),
        err("[2001:db8::1]:5000", INVALID_FORMAT),
        err("[2001:db8::1]:tag", INVALID_FORMAT),
        ok(
            "[2001:db8::1]/repo",
            "[2001:db8::1]/repo",
            "[2001:db8::1]",
            "",
        ),
        ok(
            "[2001:db8:1:2:3:4:5:6]/repo:tag",
            "[2001:db8:1:2:3:4:5:6]/repo",
            "[2001:db8:1:2:3:4:5:6]",
            "tag",
        ),
        ok(
            "[2001:db8::1]:5000/repo",
            "[2001:db8::1]:5000/repo",
            "[2001:db8::1]:5000",
            "",
        ),
        ok(
            "[2001:db8::1]:5000/repo:tag",
            "[2001:db8::1]:5000/repo",
            "[2001:db8::1]:5000",
            "tag",
        ),
        (
            format!("[2001:db8::1]:5000/repo@{SHA256_F}"),
            None,
            "[2001:db8::1]:5000/repo".into(),
            "[2001:db8::1]:5000",
            "",
            SHA256_F.into(),
        ),
        (
            format!("[2001:db8::1]:5000/repo:tag@{SHA256_F}"),
            None,
            "[2001:db8::1]:5000/repo".into(),
            "[2001:db8::1]:5000",
            "tag",
            SHA256_F.into(),
        ),
        ok(
            "[2001:db8::]:5000/repo",
            "[2001:db8::]:5000/repo",
            "[2001:db8::]:5000",
            "",
        ),
        ok("[::1]:5000/repo", "[::1]:5000/repo", "[::1]:5000", ""),
        err("[fe80::1%eth0]:5000/repo", INVALID_FORMAT),
        err("[fe80::1%@invalidzone]:5000/repo", INVALID_FORMAT),
    ];
    for (input, error, repository, domain, tag, digest) in rows {
        let got = parse(&input);
        if let Some(e) = error {
            assert_eq!(got, Err(e.to_string()), "{input}");
            continue;
        }
        let r = got.unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(r.to_string(), input);
        assert_eq!(r.repository(), repository, "{input}");
        assert_eq!(r.domain, domain, "{input}");
        assert_eq!(r.tag.as_deref().unwrap_or_default(), tag, "{input}");
        assert_eq!(r.digest.as_deref().unwrap_or_default(), digest, "{input}");
    }
}

/// reference_test.go TestSerialization's names and TestWithTag's tags, through `Parse`.
#[test]
fn serialization_and_with_tag_names() {
    let r = parse("example.com:8000/named:tagged").unwrap();
    assert_eq!(
        (r.repository().as_str(), r.tag.as_deref()),
        ("example.com:8000/named", Some("tagged"))
    );
    let d = "sha256:1234567890098765432112345667890098765432112345667890098765432112";
    let r = parse(&format!("other.com/named@{d}")).unwrap();
    assert_eq!(
        (r.repository().as_str(), r.digest.as_deref()),
        ("other.com/named", Some(d))
    );
    let r = parse("test.com:8000/foo:TAG5").unwrap();
    assert_eq!(r.to_string(), "test.com:8000/foo:TAG5");
}

/// The lowercase check upstream makes before parsing, and the errors kubelet quotes in
/// InvalidImageName (its `image_manager_test.go` uses `FAILED_IMAGE`).
#[test]
fn normalized_errors_as_upstream_words_them() {
    for (input, want) in [
        (
            "FAILED_IMAGE",
            "invalid reference format: repository name (library/FAILED_IMAGE) must be lowercase",
        ),
        (
            "docker.io/Team/App:v1",
            "invalid reference format: repository name (Team/App) must be lowercase",
        ),
        (
            "localhost:5000/Pause",
            "invalid reference format: repository name (Pause) must be lowercase",
        ),
        // An uppercase first component is a domain; one that is not a valid domain
        // leaves a name only lowercasing would make valid.
        ("Foo_bar/x", NAME_UPPERCASE),
        ("", INVALID_FORMAT),
        ("nginx:", INVALID_FORMAT),
        ("quay.io/team/app@sha256:abcd", INVALID_FORMAT),
        (
            &format!("busybox@sha256:{}", "F".repeat(64)),
            DIGEST_INVALID,
        ),
        (
            &format!("busybox@md5:{}", "f".repeat(32)),
            DIGEST_UNSUPPORTED,
        ),
        // Upstream's lowercase check reads up to the first `:`, digest included.
        (
            &format!("busybox@SHA256:{}", "f".repeat(64)),
            "invalid reference format: repository name (library/busybox@SHA256) must be lowercase",
        ),
        (
            &format!("registry.example.com/{}", "a".repeat(256)),
            NAME_TOO_LONG,
        ),
    ] {
        assert_eq!(
            parse_normalized_named(input),
            Err(want.to_string()),
            "{input}"
        );
    }
    // 255 characters of path is the most, whatever the domain adds.
    let long = format!("registry.example.com/{}", "a".repeat(255));
    assert_eq!(normalized(&long).path.len(), 255);
}

/// What credentials are looked up by (kubelet's `parsers.ParseImageName`): the
/// repository, tag and digest dropped.
#[test]
fn repositories_for_credentials() {
    for (image, want) in [
        ("busybox", "docker.io/library/busybox"),
        ("busybox:1.36", "docker.io/library/busybox"),
        (
            "docker.io/library/busybox:1.36",
            "docker.io/library/busybox",
        ),
        (
            "index.docker.io/library/busybox",
            "docker.io/library/busybox",
        ),
        ("docker.io/busybox", "docker.io/library/busybox"),
        ("team/app:v1", "docker.io/team/app"),
        (
            "quay.io/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "quay.io/team/app",
        ),
        (
            "127.0.0.1:5000/private/busybox:1.36",
            "127.0.0.1:5000/private/busybox",
        ),
        ("localhost/app", "localhost/app"),
        ("registry:5000/app", "registry:5000/app"),
    ] {
        assert_eq!(normalized(image).repository(), want, "{image}");
    }
    assert!(parse_normalized_named("Team/App").is_err());
    assert!(parse_normalized_named("").is_err());
    assert!(parse_normalized_named(&"a".repeat(64)).is_err());
}
