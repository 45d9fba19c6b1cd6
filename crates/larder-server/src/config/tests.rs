use super::*;

#[test]
fn sizes() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("1KB"), Ok(1000));
    assert_eq!(parse_size("1kib"), Ok(1024));
    assert_eq!(parse_size("1MiB"), Ok(1 << 20));
    assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert!(parse_size("1XB").is_err());
    assert!(parse_size("MiB").is_err());
    assert!(parse_size("99999999999TiB").is_err());
}

#[test]
fn durations_and_fsync() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
    assert!(parse_duration("1w").is_err());
    assert!(parse_duration("99999999999999999999d").is_err());
    assert!(parse_duration("999999999999999999d").is_err(), "overflow is an error, not a wrap");
    assert_eq!(parse_fsync("never"), Ok(FsyncPolicy::Never));
    assert_eq!(parse_fsync("ALWAYS"), Ok(FsyncPolicy::Always));
    assert_eq!(parse_fsync("1s"), Ok(FsyncPolicy::Every(Duration::from_secs(1))));
    assert!(parse_fsync("sometimes").is_err());
}

#[test]
fn file_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("larder.toml");
    std::fs::write(
        &path,
        "data_dir = \"/srv/larder\"\nvolume_size = \"64MiB\"\nvolume_count = 4\nfsync = \"always\"\nslow_request = \"250ms\"\nmax_value_size = 2048\n",
    )
    .unwrap();
    let mut args = ServeArgs { config: Some(path), ..Default::default() };
    let s = args.settings().unwrap();
    assert_eq!(s.data_dir, vec![PathBuf::from("/srv/larder")]);
    assert_eq!((s.volume_size, s.volume_count, s.max_value_size), (64 << 20, 4, 2048));
    assert_eq!(s.fsync, FsyncPolicy::Always);
    assert_eq!(s.slow_request, Duration::from_millis(250));
    args.volume_count = Some(9);
    args.data_dir = vec![PathBuf::from("/tmp/x")];
    let s = args.settings().unwrap();
    assert_eq!((s.volume_count, s.data_dir), (9, vec![PathBuf::from("/tmp/x")]));
    let defaults = ServeArgs::default().settings().unwrap();
    assert_eq!(defaults.listen.to_string(), "127.0.0.1:1234");
    assert_eq!(defaults.fsync, FsyncPolicy::Every(Duration::from_secs(1)));
    assert_eq!((defaults.memory.capacity, defaults.memory.eviction), (256 << 20, Eviction::Clock));
    assert_eq!((defaults.memory.promote_after, defaults.memory.promote_window), (2, Duration::from_secs(60)));
    assert_eq!((defaults.memory.on_put, defaults.reinsert_min_hits), (false, 1));
    assert_eq!(defaults.max_body_memory, 512 << 20);
    std::fs::write(
        dir.path().join("mem.toml"),
        "memory_capacity = \"1GiB\"\nmemory_eviction = \"sieve\"\npromote_after = 3\npromote_window = \"500ms\"\nmemory_on_put = true\nreinsert_min_hits = 0\n",
    )
    .unwrap();
    let m = ServeArgs { config: Some(dir.path().join("mem.toml")), ..Default::default() }.settings().unwrap();
    assert_eq!((m.memory.capacity, m.memory.eviction, m.memory.promote_after), (1 << 30, Eviction::Sieve, 3));
    assert_eq!((m.memory.promote_window, m.memory.on_put, m.reinsert_min_hits), (Duration::from_millis(500), true, 0));
    let high = ServeArgs { reinsert_min_hits: Some(4), ..Default::default() };
    assert!(high.settings().unwrap_err().contains("reinsert-min-hits"));
    std::fs::write(dir.path().join("bad.toml"), "volume_sise = 3\n").unwrap();
    let bad = ServeArgs { config: Some(dir.path().join("bad.toml")), ..Default::default() };
    assert!(bad.settings().unwrap_err().contains("volume_sise"));
}

#[test]
fn cluster_flags_and_file_keys_and_their_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.toml");
    std::fs::write(
        &path,
        "cluster_nodes = [\"10.0.0.1:11211\", \"10.0.0.2:11211=2\"]\ncluster_self = \"10.0.0.2:11211\"\ncluster_hash = \"ketama\"\nforeign_ttl = \"30s\"\nmax_downtime = 0\n",
    )
    .unwrap();
    let s = ServeArgs { config: Some(path.clone()), ..Default::default() }.settings().unwrap();
    let c = s.cluster.unwrap();
    assert_eq!((c.me, c.ring.placement(), c.foreign_ttl), (1, Placement::KetamaMd5, Duration::from_secs(30)));
    assert_eq!(c.ring.nodes()[1].weight, 2);
    assert_eq!(s.max_downtime, Some(Duration::ZERO));
    // Flags win, key by key; the ring alone (for `larder owner`) needs no self.
    let flags = ClusterArgs { cluster_nodes: Some("a:1,b:1".into()), cluster_hash: None };
    let ring = flags.resolve(Some(&path)).unwrap().unwrap();
    assert_eq!((ring.nodes()[0].name.as_str(), ring.placement()), ("a:1", Placement::KetamaMd5));
    assert_eq!(ClusterArgs::default().resolve(Some(&path)).unwrap().unwrap().nodes().len(), 2);
    let refused = |a: ServeArgs| a.settings().unwrap_err();
    let nodes = || ClusterArgs { cluster_nodes: Some("a:1,b:1".into()), cluster_hash: None };
    assert!(refused(ServeArgs { cluster: nodes(), ..Default::default() }).contains("needs --cluster-self"));
    assert!(
        refused(ServeArgs { cluster_self: Some("a:1".into()), ..Default::default() }).contains("needs --cluster-nodes")
    );
    assert!(refused(ServeArgs { cluster: nodes(), cluster_self: Some("c:1".into()), ..Default::default() })
        .contains("is not one of"));
    assert!(refused(ServeArgs { foreign_ttl: Some(Duration::from_secs(5)), ..Default::default() })
        .contains("--foreign-ttl needs"));
    let hash_only = ClusterArgs { cluster_nodes: None, cluster_hash: Some(Placement::Nginx) };
    assert!(refused(ServeArgs { cluster: hash_only, ..Default::default() }).contains("needs --cluster-nodes"));
    let zero = ServeArgs {
        cluster: nodes(),
        cluster_self: Some("a:1".into()),
        foreign_ttl: Some(Duration::ZERO),
        ..Default::default()
    };
    assert!(refused(zero).contains("more than 0"));
    assert!("ketama-md5".parse::<Placement>().is_err());
}
