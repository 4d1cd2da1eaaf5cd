//! The Helm chart: rendered and every manifest validated, and the real `helm` binary's lint,
//! rendering of each option, API-dependent kinds and schema refusals.

use super::*;

#[test]
fn chart_renders_and_every_manifest_validates() {
    let python = venv_python();
    let root = workspace_root();
    // The chart carries the dashboard the repository documents.
    assert_eq!(
        std::fs::read(root.join("dashboards/hami.json")).unwrap(),
        std::fs::read(root.join("deploy/helm/hami-agent/files/hami.json")).unwrap(),
        "deploy/helm/hami-agent/files/hami.json differs from dashboards/hami.json: copy it"
    );
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(&python)
        .arg(root.join("deploy/check_chart.py"))
        .arg(root.join("deploy/helm/hami-agent"))
        .arg(out_dir.path())
        .arg("{}")
        .arg(r#"{"agent":{"reclaim":true,"hamiCompat":true,"hamiVersion":"2.9","hamiMetricsPort":9394,"perProcessMetrics":true,"allowUnhookedNamespaces":["gpu-raw"]},"runtimeClassName":"nvidia","seccompProfile":"Unconfined","hamiSwap":{"enabled":true,"devicePluginWithoutLib":true},"serviceMonitor":{"enabled":true},"prometheusRule":{"enabled":true}}"#)
        .arg(r#"{"hamiSwap":{"enabled":true,"mode":"rollback","vgpuDir":"/opt/hami/vgpu"}}"#)
        .arg(r#"{"hamiSwap":{"enabled":true,"removeStaleFolders":true}}"#)
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    assert!(log.contains("manifests valid"), "{log}");
    // What the DaemonSet asks for: host pids, the listed capabilities and nothing more.
    let ds = std::fs::read_to_string(out_dir.path().join("0-hami-agent_templates_daemonset.yaml"))
        .unwrap();
    assert!(ds.contains("hostPID: true"), "{ds}");
    assert!(ds.contains("privileged: false"));
    assert!(!ds.contains("- SYS_ADMIN"));
    assert!(!ds.contains("- DAC_OVERRIDE"), "only with agent.reclaim");
    let ds_reclaim =
        std::fs::read_to_string(out_dir.path().join("1-hami-agent_templates_daemonset.yaml"))
            .unwrap();
    assert!(ds_reclaim.contains("- DAC_OVERRIDE"), "{ds_reclaim}");
    // hamiSwap: the second container watches HAMi's host folder (read-write, no capability);
    // off by default; rollback mode holds after putting HAMi's files back.
    assert!(!ds.contains("hami-swap"), "hamiSwap is opt-in");
    assert!(ds_reclaim.contains("- name: hami-swap"), "{ds_reclaim}");
    assert!(ds_reclaim.contains("- --allow-unhooked-namespace=gpu-raw\n"));
    assert!(ds_reclaim.contains("/usr/lib/hami/hami-swap.sh"));
    assert!(ds_reclaim.contains("- watch\n"), "{ds_reclaim}");
    assert!(ds_reclaim.contains("- --interval=10\n"));
    assert!(ds_reclaim.contains("- --check-ms=500\n"));
    assert!(ds_reclaim.contains("- --device-plugin-without-lib\n"));
    assert!(ds_reclaim.contains("path: /usr/local/vgpu\n"));
    let ds_rollback =
        std::fs::read_to_string(out_dir.path().join("2-hami-agent_templates_daemonset.yaml"))
            .unwrap();
    assert!(ds_rollback.contains("- rollback\n"), "{ds_rollback}");
    assert!(ds_rollback.contains("- --hold\n"));
    assert!(
        !ds_rollback.contains("--check-ms"),
        "watch's settings only: {ds_rollback}"
    );
    assert!(ds_rollback.contains("path: /opt/hami/vgpu\n"));
    assert!(
        !ds_reclaim.contains("--pod-logs"),
        "removeStaleFolders is opt-in"
    );
    let ds_gc =
        std::fs::read_to_string(out_dir.path().join("3-hami-agent_templates_daemonset.yaml"))
            .unwrap();
    assert!(
        ds_gc.contains("- --pod-logs=/host/var/log/pods\n"),
        "{ds_gc}"
    );
    assert!(ds_gc.contains("- --self-uid=$(POD_UID)\n"));
    assert!(ds_gc.contains("fieldPath: metadata.uid"));
    // The prometheus-operator kinds: by default (auto) only where the API is served, which
    // Helm's default capabilities do not; forced on with `enabled: true`.
    for kind in ["servicemonitor", "prometheusrule"] {
        assert!(
            !out_dir
                .path()
                .join(format!("0-hami-agent_templates_{kind}.yaml"))
                .exists(),
            "{kind} rendered without monitoring.coreos.com/v1"
        );
    }
    assert!(out_dir
        .path()
        .join("1-hami-agent_templates_prometheusrule.yaml")
        .exists());
    let sm = std::fs::read_to_string(
        out_dir
            .path()
            .join("1-hami-agent_templates_servicemonitor.yaml"),
    )
    .unwrap();
    // The agent's namespace/pod/container/node labels win over the target's.
    assert!(sm.contains("honorLabels: true"), "{sm}");
    // HAMi's families: the release's label sets, and alone on HAMi's monitor port, which
    // the Service and the ServiceMonitor carry too; by default with the agent's.
    assert!(!ds.contains("--hami-"), "{ds}");
    assert!(ds_reclaim.contains("- --hami-compat\n"), "{ds_reclaim}");
    assert!(ds_reclaim.contains("- --hami-version=2.9\n"));
    assert!(ds_reclaim.contains("- --hami-metrics-addr=:9394\n"));
    assert!(ds_reclaim.contains("- name: hami-metrics\n              containerPort: 9394\n"));
    assert_eq!(sm.matches("- port: ").count(), 2, "{sm}");
    assert!(sm.contains("- port: hami-metrics\n"), "{sm}");
    assert_eq!(sm.matches("honorLabels: true").count(), 2, "{sm}");
    let svc = std::fs::read_to_string(out_dir.path().join("1-hami-agent_templates_service.yaml"))
        .unwrap();
    assert!(
        svc.contains("port: 9394\n      targetPort: hami-metrics\n"),
        "{svc}"
    );
    // The agent's `node` label: the pod's node, through the downward API.
    assert!(
        ds.contains("- name: NODE_NAME\n              valueFrom:\n                fieldRef:\n                  fieldPath: spec.nodeName\n"),
        "{ds}"
    );
    // The defaults: GPU nodes only, system-node-critical, RuntimeDefault seccomp.
    assert!(
        ds.contains("priorityClassName: system-node-critical\n"),
        "{ds}"
    );
    assert!(ds.contains("type: RuntimeDefault\n"), "{ds}");
    assert!(ds.contains("key: nvidia.com/gpu.present\n"), "{ds}");
    assert!(ds_reclaim.contains("type: Unconfined\n"), "{ds_reclaim}");
}

/// The real `helm` binary (v4, from `cargo xtask setup`) lints the chart strictly and
/// renders the hamiSwap option as the chart documents it (docs/deploy.md); a bad mode is
/// refused with a message naming it.
#[test]
fn real_helm_lints_strict_and_renders_the_hami_swap_option() {
    let helm = helm_bin();
    let chart = workspace_root().join("deploy/helm/hami-agent");
    let v = Command::new(&helm)
        .args(["version", "--short"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&v.stdout).starts_with("v4."),
        "{v:?}"
    );
    for set in [
        &[][..],
        &[
            "hamiSwap.enabled=true",
            "hamiSwap.removeStaleFolders=true",
            "agent.hamiCompat=true",
            "agent.allowUnhookedNamespaces={gpu-raw}",
        ][..],
        &["hamiSwap.enabled=true", "hamiSwap.mode=rollback"][..],
    ] {
        let mut c = Command::new(&helm);
        c.args(["lint", "--strict"]).arg(&chart);
        for s in set {
            c.args(["--set", s]);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "helm lint --strict {set:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let render = |set: &[&str]| {
        let mut c = Command::new(&helm);
        c.args(["template", "hami", "-n", "hami-system"])
            .arg(&chart);
        for s in set {
            c.args(["--set", s]);
        }
        c.output().unwrap()
    };
    let out = render(&[
        "hamiSwap.enabled=true",
        "hamiSwap.vgpuDir=/opt/hami/vgpu",
        "agent.allowUnhookedNamespaces={gpu-raw}",
    ]);
    let y = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(y.contains("- name: hami-swap"), "{y}");
    assert!(y.contains("- watch\n") && y.contains("- --vgpu-dir=/host/vgpu\n"));
    assert!(y.contains("- --check-ms=500\n"), "{y}");
    assert!(
        !y.contains("--device-plugin-without-lib"),
        "HAMi's own image is the default: {y}"
    );
    assert!(y.contains("path: /opt/hami/vgpu\n"));
    assert!(y.contains("- --allow-unhooked-namespace=gpu-raw\n"));
    // Option B (HAMi's device plugin without its library; required on HAMi 2.4).
    let out = render(&[
        "hamiSwap.enabled=true",
        "hamiSwap.devicePluginWithoutLib=true",
        "hamiSwap.checkMs=200",
    ]);
    let yb = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(yb.contains("- --device-plugin-without-lib\n"), "{yb}");
    assert!(yb.contains("- --check-ms=200\n"), "{yb}");
    let out = render(&[]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hami-swap"));
    let out = render(&["hamiSwap.enabled=true", "hamiSwap.mode=sideways"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hamiSwap.mode must be install or rollback") && err.contains("sideways"),
        "{err}"
    );
    // HAMi's families: a release whose label sets are known, a port of their own only with
    // them and not the agent's.
    for (set, why) in [
        (
            &["agent.hamiCompat=true", "agent.hamiVersion=2.8"][..],
            "hamiVersion",
        ),
        (
            &["agent.hamiMetricsPort=9394"][..],
            "agent.hamiMetricsPort needs agent.hamiCompat=true",
        ),
        (
            &["agent.hamiCompat=true", "agent.hamiMetricsPort=9494"][..],
            "agent.hamiMetricsPort must differ from metricsPort",
        ),
    ] {
        let out = render(set);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{set:?}: {err}");
    }
}

/// ServiceMonitor and PrometheusRule need prometheus-operator's CRDs: rendered by default only
/// when the cluster serves monitoring.coreos.com/v1, so the chart installs on a cluster
/// without them; `true` and `false` force them either way.
#[test]
fn real_helm_renders_the_prometheus_operator_kinds_only_where_the_api_exists() {
    let api = ["--api-versions", "monitoring.coreos.com/v1"];
    let without = rendered_kinds(&[]);
    assert!(without.contains(&"DaemonSet".to_string()), "{without:?}");
    assert!(
        !without
            .iter()
            .any(|k| k == "ServiceMonitor" || k == "PrometheusRule"),
        "rendered without the monitoring API: {without:?}"
    );
    let with = rendered_kinds(&api);
    assert!(with.contains(&"ServiceMonitor".to_string()), "{with:?}");
    assert!(with.contains(&"PrometheusRule".to_string()), "{with:?}");
    let forced = rendered_kinds(&[
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
    ]);
    assert!(forced.contains(&"ServiceMonitor".to_string()), "{forced:?}");
    assert!(forced.contains(&"PrometheusRule".to_string()), "{forced:?}");
    let off = rendered_kinds(&[
        api[0],
        api[1],
        "--set",
        "serviceMonitor.enabled=false",
        "--set",
        "prometheusRule.enabled=auto",
    ]);
    assert!(!off.contains(&"ServiceMonitor".to_string()), "{off:?}");
    assert!(off.contains(&"PrometheusRule".to_string()), "{off:?}");
    // Lint passes both ways (`helm lint` has no --api-versions: forced on instead).
    for set in [
        &[][..],
        &[
            "--set",
            "serviceMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
        ][..],
    ] {
        let out = Command::new(helm_bin())
            .args(["lint", "--strict"])
            .arg(workspace_root().join("deploy/helm/hami-agent"))
            .args(set)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "helm lint --strict {set:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The DaemonSet's defaults: only on GPU nodes (NVIDIA's feature-discovery label or HAMi's
/// `gpu=on`, either one), `system-node-critical`, seccomp `RuntimeDefault`; each a value.
#[test]
fn real_helm_renders_gpu_node_affinity_priority_and_seccomp_by_default() {
    let out = helm_template(&["--show-only", "templates/daemonset.yaml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ds = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        ds.contains("      priorityClassName: system-node-critical\n"),
        "{ds}"
    );
    assert!(
        ds.contains("        seccompProfile:\n          type: RuntimeDefault\n"),
        "{ds}"
    );
    assert!(!ds.contains("Unconfined"), "{ds}");
    // Two nodeSelectorTerms (ORed), one label each.
    let terms = "      affinity:\n        nodeAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            nodeSelectorTerms:\n            - matchExpressions:\n              - key: nvidia.com/gpu.present\n                operator: In\n                values:\n                - \"true\"\n            - matchExpressions:\n              - key: gpu\n                operator: In\n                values:\n                - \"on\"\n";
    assert!(ds.contains(terms), "{ds}");
    // Each is a value: off, another class, Unconfined for older runtimes.
    let out = helm_template(&[
        "--show-only",
        "templates/daemonset.yaml",
        "--set",
        "gpuNodeAffinity.enabled=false",
        "--set",
        "priorityClassName=",
        "--set",
        "seccompProfile=Unconfined",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ds = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!ds.contains("affinity:"), "{ds}");
    assert!(!ds.contains("priorityClassName"), "{ds}");
    assert!(ds.contains("type: Unconfined\n"), "{ds}");
    // An affinity of the user's own replaces the GPU default's nodeAffinity.
    let out = helm_template(&[
        "--show-only",
        "templates/daemonset.yaml",
        "--set-json",
        r#"affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["gpu-a"]}]}]}}}"#,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ds = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(ds.contains("- key: pool\n"), "{ds}");
    assert!(!ds.contains("nvidia.com/gpu.present"), "{ds}");
}

/// values.schema.json refuses at install what the agent would refuse at start (a log format
/// it does not know) and keys the chart does not have, top-level and nested.
#[test]
fn real_helm_refuses_values_the_schema_does_not_allow() {
    for (set, names) in [
        ("agent.logFormat=yaml", "/agent/logFormat"),
        ("logFormat=yaml", "logFormat"),
        ("serviceMonitr.enabled=true", "serviceMonitr"),
        ("agent.perProccessMetrics=true", "perProccessMetrics"),
        ("serviceMonitor.enabled=maybe", "/serviceMonitor/enabled"),
        ("seccompProfile=Unconfind", "/seccompProfile"),
    ] {
        let out = helm_template(&["--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {set} accepted");
        assert!(err.contains(names), "--set {set}: {err}");
        let lint = Command::new(helm_bin())
            .args(["lint", "--strict"])
            .arg(workspace_root().join("deploy/helm/hami-agent"))
            .args(["--set", set])
            .output()
            .unwrap();
        assert!(!lint.status.success(), "helm lint --set {set} passed");
    }
    // The two formats the agent's --log-format takes are accepted, and reach its flag.
    for f in ["text", "json"] {
        let out = helm_template(&["--set", &format!("agent.logFormat={f}")]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("- --log-format={f}\n")));
    }
}

/// The PrometheusRule's runbook links point where the operator serves docs/runbooks.md
/// (`prometheusRule.runbookBaseUrl`), each at its alert's section; without it they stay the
/// repository's relative `docs/runbooks.md#...`; anything but an http(s) URL is refused.
#[test]
fn real_helm_points_the_runbook_links_at_the_configured_base() {
    let base = "https://wiki.example/gpu/hami-runbooks";
    let render = |extra: &[&str]| {
        let mut args = vec![
            "--show-only",
            "templates/prometheusrule.yaml",
            "--api-versions",
            "monitoring.coreos.com/v1",
        ];
        args.extend_from_slice(extra);
        let out = helm_template(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let set = format!("prometheusRule.runbookBaseUrl={base}");
    let y = render(&["--set", &set]);
    let links: Vec<&str> = y
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .collect();
    assert_eq!(links.len(), 10, "{y}");
    assert!(
        links.contains(&format!("\"{base}#hamigpumemorybypass\"").as_str()),
        "{links:?}"
    );
    assert!(
        links.iter().all(|l| l.starts_with(&format!("\"{base}#"))),
        "{links:?}"
    );
    assert!(!y.contains("\"docs/runbooks.md#"), "{y}");
    let plain = render(&[]);
    assert!(
        plain.contains("runbook_url: \"docs/runbooks.md#hamiagentdown\""),
        "{plain}"
    );
    let out = helm_template(&["--set", "prometheusRule.runbookBaseUrl=javascript:alert(1)"]);
    assert!(!out.status.success(), "a non-URL base accepted");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/prometheusRule/runbookBaseUrl"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
