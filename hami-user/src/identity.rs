//! Who a GPU process belongs to, in the names a cluster uses: Kubernetes namespace, pod and
//! container name, from what every node has without credentials.
//!
//! Sources, in order (each one a pure parser below, with its unit tests):
//! 1. the process's cgroup path gives the **container id** and the **pod UID**
//!    (containerd, CRI-O and Docker; cgroupfs and systemd drivers; cgroup v1 and v2);
//! 2. the kubelet's log links `/var/log/containers/<pod>_<namespace>_<container>-<id>.log`
//!    map the container id to all three names (written by the kubelet for every container on
//!    every node, whatever the runtime);
//! 3. the kubelet's pod log folders `/var/log/pods/<namespace>_<pod>_<uid>/<container>/` map
//!    the pod UID to namespace and pod (and the container when the pod has one);
//! 4. HAMi's per-container folder `<pod uid>_<container name>` (HAMi's device plugin
//!    bind-mounts `/usr/local/vgpu/containers/<uid>_<name>` into the container; its name is
//!    read from the process's `mountinfo` entry that holds the region file) gives the
//!    container name when 2 and 3 do not.
//!
//! Fallbacks, documented in `docs/agent.md`: namespace and pod stay empty (a container
//! outside Kubernetes), the container name becomes the first 12 characters of the container
//! id, or `host` for a process in no container, or the cgroup path.
//!
//! Not used: the kubelet's pod-resources gRPC socket (it names pods but not their UIDs nor
//! container ids, so it cannot be joined with a process) and the kubelet's `/pods` endpoint
//! (it needs a credential the agent should not hold).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::procinfo;

/// Where the kubelet's logs are on a node (the chart mounts it read-only).
pub const DEFAULT_LOG_ROOT: &str = "/var/log";

/// The names of one container, as the metrics label it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// Kubernetes namespace (empty outside Kubernetes or when unknown).
    pub namespace: String,
    /// Pod name (empty outside Kubernetes or when unknown).
    pub pod: String,
    /// Container name; falls back to the short container id, `host`, or the cgroup path.
    pub container: String,
    /// Pod UID from the cgroup path (empty when none).
    pub pod_uid: String,
    /// Full container id from the cgroup path (empty when none).
    pub container_id: String,
}

fn is_uid(s: &str) -> bool {
    // 8-4-4-4-12 hex with dashes (36 characters).
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The pod UID named by a cgroup path, or `None`.
///
/// Shapes: cgroupfs driver `/kubepods/<qos>/pod<uid>/<id>` and `/kubepods/pod<uid>/<id>`;
/// systemd driver `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/...`
/// and `kubepods-pod<uid>.slice`; the containerd-in-systemd form
/// `.../kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>`.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    for comp in cgroup.split('/') {
        // `<slice>:cri-containerd:<id>`: the pod is in the slice part.
        let comp = comp.split(':').next().unwrap_or(comp);
        let comp = comp.strip_suffix(".slice").unwrap_or(comp);
        let Some(i) = comp.rfind("pod") else { continue };
        let cand = comp[i + 3..].replace('_', "-");
        if is_uid(&cand) {
            let prefix = &comp[..i];
            // `pod<uid>` alone, or `kubepods-...-pod<uid>`.
            if prefix.is_empty() || prefix.starts_with("kubepods") {
                return Some(cand.to_ascii_lowercase());
            }
        }
    }
    None
}

/// A `/var/log/containers` link name: `<pod>_<namespace>_<container>-<64 hex id>.log` →
/// `(pod, namespace, container, id)`. Pod and namespace names cannot hold `_`; a container
/// name cannot either (DNS labels), so the split is exact.
pub fn parse_container_log_name(name: &str) -> Option<(String, String, String, String)> {
    let stem = name.strip_suffix(".log")?;
    let (rest, id) = stem.rsplit_once('-')?;
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut it = rest.splitn(3, '_');
    let (pod, ns, ctr) = (it.next()?, it.next()?, it.next()?);
    if pod.is_empty() || ns.is_empty() || ctr.is_empty() || ctr.contains('_') {
        return None;
    }
    Some((pod.into(), ns.into(), ctr.into(), id.to_ascii_lowercase()))
}

/// A `/var/log/pods` folder name: `<namespace>_<pod>_<uid>` → `(namespace, pod, uid)`.
pub fn parse_pod_log_dir(name: &str) -> Option<(String, String, String)> {
    let mut it = name.splitn(3, '_');
    let (ns, pod, uid) = (it.next()?, it.next()?, it.next()?);
    if ns.is_empty() || pod.is_empty() || !is_uid(uid) {
        return None;
    }
    Some((ns.into(), pod.into(), uid.to_ascii_lowercase()))
}

/// HAMi's per-container folder name `<pod uid>_<container name>` → `(uid, container)`.
pub fn parse_hami_folder(name: &str) -> Option<(String, String)> {
    let (uid, ctr) = name.split_once('_')?;
    if !is_uid(uid) || ctr.is_empty() {
        return None;
    }
    Some((uid.to_ascii_lowercase(), ctr.to_string()))
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The HAMi container folder holding `path` (a path inside the process's mount namespace),
/// from its `/proc/<pid>/mountinfo`: the mount with the longest mount point above `path`
/// whose source root ends in `<uid>_<container>`.
///
/// Not procfs's `MountInfo` parser: the process's mounts are the tenant's (root in its user
/// namespace may mount anything), and that parser fails the whole file on one line a tenant
/// can write (a mount whose source is the empty string leaves a field out), and leaves the
/// octal escapes in the paths.
pub fn hami_folder_from_mountinfo(mountinfo: &str, path: &str) -> Option<(String, String)> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let mut f = line.split(' ');
        let (_id, _parent, _dev) = (f.next()?, f.next()?, f.next()?);
        let (Some(root), Some(mnt)) = (f.next(), f.next()) else {
            continue;
        };
        let (root, mnt) = (unescape_mountinfo(root), unescape_mountinfo(mnt));
        let under = path == mnt
            || mnt == "/"
            || path
                .strip_prefix(mnt.as_str())
                .is_some_and(|r| r.starts_with('/'));
        if under && best.as_ref().is_none_or(|(l, _)| mnt.len() >= *l) {
            best = Some((mnt.len(), root));
        }
    }
    let (_, root) = best?;
    let last = root.trim_end_matches('/').rsplit('/').next()?;
    parse_hami_folder(last)
}

/// The fallback container name: short container id, `host`, or the cgroup path.
pub fn fallback_container(cgroup: &str, container_id: Option<&str>) -> String {
    match container_id {
        Some(id) => id.chars().take(12).collect(),
        None if cgroup.is_empty() || cgroup == "/" => "host".to_string(),
        None => cgroup.to_string(),
    }
}

/// Resolves identities, caching what the kubelet's log folders say (re-read at most every
/// `refresh`, and at once for an id not seen yet, limited to that same period).
#[derive(Debug)]
pub struct Resolver {
    log_root: PathBuf,
    refresh: Duration,
    last_read: Option<Instant>,
    /// container id → (pod, namespace, container).
    by_container: HashMap<String, (String, String, String)>,
    /// pod uid → (namespace, pod, container folders).
    by_pod: HashMap<String, (String, String, Vec<String>)>,
}

impl Resolver {
    /// A resolver reading the kubelet's logs under `log_root` (usually `/var/log`).
    pub fn new(log_root: impl Into<PathBuf>) -> Resolver {
        Resolver {
            log_root: log_root.into(),
            refresh: Duration::from_secs(10),
            last_read: None,
            by_container: HashMap::new(),
            by_pod: HashMap::new(),
        }
    }

    fn reload(&mut self) {
        self.last_read = Some(Instant::now());
        self.by_container.clear();
        self.by_pod.clear();
        if let Ok(rd) = std::fs::read_dir(self.log_root.join("containers")) {
            for e in rd.flatten() {
                let name = e.file_name();
                if let Some((pod, ns, ctr, id)) = parse_container_log_name(&name.to_string_lossy())
                {
                    self.by_container.insert(id, (pod, ns, ctr));
                }
            }
        }
        if let Ok(rd) = std::fs::read_dir(self.log_root.join("pods")) {
            for e in rd.flatten() {
                let name = e.file_name();
                if let Some((ns, pod, uid)) = parse_pod_log_dir(&name.to_string_lossy()) {
                    let ctrs = std::fs::read_dir(e.path())
                        .map(|rd| {
                            rd.flatten()
                                .filter(|c| c.path().is_dir())
                                .map(|c| c.file_name().to_string_lossy().into_owned())
                                .collect()
                        })
                        .unwrap_or_default();
                    self.by_pod.insert(uid, (ns, pod, ctrs));
                }
            }
        }
    }

    fn maybe_reload(&mut self, want_cid: Option<&str>, want_uid: Option<&str>) {
        let stale = self.last_read.is_none_or(|t| t.elapsed() >= self.refresh);
        let missing = want_cid.is_some_and(|c| !self.by_container.contains_key(c))
            || want_uid.is_some_and(|u| !self.by_pod.contains_key(u));
        let may_retry = self
            .last_read
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if stale || (missing && may_retry) {
            self.reload();
        }
    }

    /// The identity of a process with this cgroup path; `hami_folder` is the HAMi container
    /// folder its region lies in, when known.
    pub fn resolve(&mut self, cgroup: &str, hami_folder: Option<(String, String)>) -> Identity {
        let cid = procinfo::container_id(cgroup);
        let uid = pod_uid(cgroup).or_else(|| hami_folder.as_ref().map(|(u, _)| u.clone()));
        if cid.is_some() || uid.is_some() {
            self.maybe_reload(cid.as_deref(), uid.as_deref());
        }
        let mut id = Identity {
            pod_uid: uid.clone().unwrap_or_default(),
            container_id: cid.clone().unwrap_or_default(),
            ..Identity::default()
        };
        if let Some((pod, ns, ctr)) = cid.as_ref().and_then(|c| self.by_container.get(c)) {
            id.namespace = ns.clone();
            id.pod = pod.clone();
            id.container = ctr.clone();
            return id;
        }
        if let Some((ns, pod, ctrs)) = uid.as_ref().and_then(|u| self.by_pod.get(u)) {
            id.namespace = ns.clone();
            id.pod = pod.clone();
            if ctrs.len() == 1 {
                id.container = ctrs[0].clone();
            }
        }
        if id.container.is_empty() {
            id.container = match hami_folder {
                Some((_, ctr)) => ctr,
                None => fallback_container(cgroup, cid.as_deref()),
            };
        }
        id
    }
}

/// Reads `/proc/<pid>/mountinfo` (at most [`crate::tenantfs::MAX_PROC_FILE`] bytes: a
/// tenant can mount as much as it likes) and finds the HAMi folder holding `path`.
pub fn hami_folder_of(proc_root: &Path, pid: u32, path: &str) -> Option<(String, String)> {
    let raw =
        crate::tenantfs::read_proc_file(&proc_root.join(pid.to_string()).join("mountinfo")).ok()?;
    hami_folder_from_mountinfo(&String::from_utf8_lossy(&raw), path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "4c1b5f1e9a2d3c4b5a6978877665544332211000ffeeddccbbaa998877665544";
    const UID: &str = "6f0e3f3c-93e2-4b44-8b8c-2b0d9e1f7a10";

    #[test]
    fn pod_uid_from_real_looking_cgroup_paths() {
        let uid_ = UID.replace('-', "_");
        let cases = [
            // containerd, systemd driver, cgroup v2.
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{CID}.scope"),
            // CRI-O, systemd driver, guaranteed QoS.
            format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-{CID}.scope"),
            // cgroupfs driver, cgroup v1 (memory controller line's path).
            format!("/kubepods/besteffort/pod{UID}/{CID}"),
            format!("/kubepods/pod{UID}/{CID}"),
            // containerd's systemd form inside system.slice.
            format!("/system.slice/containerd.service/kubepods-besteffort-pod{uid_}.slice:cri-containerd:{CID}"),
            // docker shim (cri-dockerd), systemd driver.
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/docker-{CID}.scope"),
        ];
        for c in &cases {
            assert_eq!(pod_uid(c).as_deref(), Some(UID), "{c}");
            assert_eq!(procinfo::container_id(c).as_deref(), Some(CID), "{c}");
        }
        for c in [
            "/",
            "/user.slice/user-0.slice/session-3.scope",
            &format!("/system.slice/docker-{CID}.scope"),
            &format!("/docker/{CID}"),
            "/kubepods.slice/kubepods-besteffort.slice",
            "/mypod12345678-1234-1234-1234-123456789012",
        ] {
            assert_eq!(pod_uid(c), None, "{c}");
        }
    }

    #[test]
    fn kubelet_log_names() {
        let n = format!("trainer-7d9f_ml-team_cuda-main-{CID}.log");
        assert_eq!(
            parse_container_log_name(&n),
            Some((
                "trainer-7d9f".into(),
                "ml-team".into(),
                "cuda-main".into(),
                CID.into()
            ))
        );
        assert_eq!(parse_container_log_name("x_y_z-abc.log"), None);
        assert_eq!(parse_container_log_name(&format!("x_y-{CID}.log")), None);
        assert_eq!(
            parse_pod_log_dir(&format!("ml-team_trainer-7d9f_{UID}")),
            Some(("ml-team".into(), "trainer-7d9f".into(), UID.into()))
        );
        assert_eq!(parse_pod_log_dir("a_b_notauid"), None);
        assert_eq!(
            parse_hami_folder(&format!("{UID}_cuda-main")),
            Some((UID.into(), "cuda-main".into()))
        );
        assert_eq!(parse_hami_folder("foo_bar"), None);
    }

    #[test]
    fn hami_folder_from_a_container_mountinfo() {
        let mi = format!(
            "1000 900 0:310 / / rw,relatime - overlay overlay rw,lowerdir=/x\n\
             1001 1000 8:1 /usr/local/vgpu/containers/{UID}_cuda-main /tmp/vgpu rw,relatime - ext4 /dev/sda1 rw\n\
             1002 1000 8:1 /usr/local/vgpu/libvgpu.so /usr/local/vgpu/libvgpu.so ro - ext4 /dev/sda1 rw\n\
             1003 1000 8:1 /var/lib/kubelet/pods/{UID}/etc-hosts /etc/hosts rw - ext4 /dev/sda1 rw\n"
        );
        assert_eq!(
            hami_folder_from_mountinfo(&mi, "/tmp/vgpu/abc.cache"),
            Some((UID.into(), "cuda-main".into()))
        );
        // The overlay root is not a HAMi folder.
        assert_eq!(hami_folder_from_mountinfo(&mi, "/tmp/other.cache"), None);
        // A prefix that is not a path component does not count.
        assert_eq!(hami_folder_from_mountinfo(&mi, "/tmp/vgpux/a.cache"), None);
    }

    #[test]
    fn resolver_uses_the_kubelet_logs_then_falls_back() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("containers")).unwrap();
        std::fs::write(
            root.join(format!("containers/trainer-0_ml_main-{CID}.log")),
            "",
        )
        .unwrap();
        let other_uid = "11111111-2222-3333-4444-555555555555";
        std::fs::create_dir_all(root.join(format!("pods/ml_solo-0_{other_uid}/worker"))).unwrap();
        let mut r = Resolver::new(root);
        let uid_ = UID.replace('-', "_");
        let cg = format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{CID}.scope");
        let id = r.resolve(&cg, None);
        assert_eq!(
            (
                id.namespace.as_str(),
                id.pod.as_str(),
                id.container.as_str()
            ),
            ("ml", "trainer-0", "main")
        );
        assert_eq!(id.pod_uid, UID);
        // Pod folder only: namespace and pod from it, its single container's name.
        let cid2 = "ab".repeat(32);
        let cg2 = format!("/kubepods/besteffort/pod{other_uid}/{cid2}");
        let id2 = r.resolve(&cg2, None);
        assert_eq!(
            (
                id2.namespace.as_str(),
                id2.pod.as_str(),
                id2.container.as_str()
            ),
            ("ml", "solo-0", "worker")
        );
        // Nothing known: the HAMi folder's container name, else the short id.
        let cid3 = "cd".repeat(32);
        let id3 = r.resolve(
            &format!("/docker/{cid3}"),
            Some((UID.to_string(), "from-hami".to_string())),
        );
        assert_eq!(id3.container, "from-hami");
        let id4 = r.resolve(&format!("/docker/{cid3}"), None);
        assert_eq!(id4.container, "cdcdcdcdcdcd");
        assert_eq!((id4.namespace.as_str(), id4.pod.as_str()), ("", ""));
        assert_eq!(r.resolve("/", None).container, "host");
    }
}
