use super::*;

const DEFAULT: u32 = CorePolicy::Default as u32;
const FORCE: u32 = CorePolicy::Force as u32;
const DISABLE: u32 = CorePolicy::Disable as u32;

fn t(share: u32, policy: u32, priority: u32, busy: bool) -> Tenant {
    Tenant {
        share: share_percent(share, policy),
        policy,
        priority,
        busy,
    }
}

fn bps(ts: &[Tenant]) -> Vec<Option<u32>> {
    decide(ts).iter().map(|g| g.map(|g| g.bp)).collect()
}

#[test]
fn grants_are_self_checking_words() {
    for g in [
        Grant::default(),
        Grant {
            bp: FULL_BP,
            held: false,
            lent: true,
        },
        Grant {
            bp: 0,
            held: true,
            lent: false,
        },
        Grant {
            bp: 3750,
            held: false,
            lent: true,
        },
    ] {
        assert_eq!(decode_grant(encode_grant(g)), Some(g));
    }
    assert_eq!(decode_grant(0), None, "no decision");
    let w = encode_grant(Grant {
        bp: 3000,
        ..Grant::default()
    });
    // A torn write (one half new, one old) or a hand-made value is no grant.
    let other = encode_grant(Grant {
        bp: FULL_BP,
        ..Grant::default()
    });
    assert_eq!(decode_grant((w & 0xffff) | (other & 0xffff_0000)), None);
    assert_eq!(decode_grant(10_000), None);
    assert_eq!(decode_grant(u32::MAX), None);
    // Above the whole GPU: none.
    let lo = 12_000u32;
    assert_eq!(decode_grant(lo | ((!lo & 0xffff) << 16)), None);
}

#[test]
fn the_gate_takes_a_fresh_grant_else_the_share() {
    let now = 10_000_000_000u64;
    let full = encode_grant(Grant {
        bp: FULL_BP,
        held: false,
        lent: true,
    });
    let held = encode_grant(Grant {
        bp: 0,
        held: true,
        lent: false,
    });
    // default: the grant, lent or held.
    assert_eq!(rate_bp(30, DEFAULT, full, now, now), Some(FULL_BP));
    assert_eq!(rate_bp(30, DEFAULT, held, now, now), Some(0));
    // force: never above the share, lowered by a hold.
    assert_eq!(rate_bp(30, FORCE, full, now, now), Some(3000));
    assert_eq!(rate_bp(30, FORCE, held, now, now), Some(0));
    // disable or no share: no limit, whatever is granted.
    assert_eq!(rate_bp(30, DISABLE, held, now, now), None);
    assert_eq!(rate_bp(0, DEFAULT, held, now, now), None);
    assert_eq!(rate_bp(100, DEFAULT, held, now, now), None);
    // Stale, never written, stamped in the future, malformed: the share.
    assert_eq!(
        rate_bp(30, DEFAULT, full, now - GRANT_TTL_NS - 1, now),
        Some(3000)
    );
    assert_eq!(
        rate_bp(30, DEFAULT, full, now - GRANT_TTL_NS, now),
        Some(FULL_BP)
    );
    assert_eq!(rate_bp(30, DEFAULT, full, 0, now), Some(3000));
    assert_eq!(
        rate_bp(30, DEFAULT, full, now + FUTURE_SLACK_NS + 1, now),
        Some(3000)
    );
    assert_eq!(rate_bp(30, DEFAULT, 0, now, now), Some(3000));
    assert_eq!(rate_bp(30, DEFAULT, full ^ 1, now, now), Some(3000));
}

#[test]
fn default_lends_idle_time_in_proportion_to_shares() {
    // Both busy: 37.5 / 62.5 %.
    assert_eq!(
        bps(&[t(30, DEFAULT, 1, true), t(50, DEFAULT, 1, true)]),
        vec![Some(3750), Some(6250)]
    );
    // One alone: the whole GPU; the idle one keeps its share ready.
    assert_eq!(
        bps(&[t(30, DEFAULT, 1, true), t(50, DEFAULT, 1, false)]),
        vec![Some(FULL_BP), Some(5000)]
    );
    assert!(decide(&[t(30, DEFAULT, 1, true)])[0].unwrap().lent);
    // Nobody busy: everyone at its share.
    assert_eq!(
        bps(&[t(30, DEFAULT, 1, false), t(50, DEFAULT, 1, false)]),
        vec![Some(3000), Some(5000)]
    );
    // A busy force neighbour keeps its share, the default one gets the rest.
    assert_eq!(
        bps(&[t(30, DEFAULT, 1, true), t(50, FORCE, 1, true)]),
        vec![Some(5000), Some(5000)]
    );
    assert_eq!(bps(&[t(30, FORCE, 1, true)]), vec![Some(3000)]);
    // Oversubscribed shares: nobody below its share (the GPU time-slices the excess).
    assert_eq!(
        bps(&[t(60, DEFAULT, 1, true), t(70, DEFAULT, 1, true)]),
        vec![Some(6000), Some(7000)]
    );
    // No share, disable: no grant; they do not count in the split.
    assert_eq!(
        bps(&[
            t(0, DEFAULT, 1, true),
            t(40, DISABLE, 1, true),
            t(40, DEFAULT, 1, true)
        ]),
        vec![None, None, Some(FULL_BP)]
    );
}

#[test]
fn a_busy_higher_priority_holds_the_lower_ones() {
    // Priority 0 (high) busy: the priority-1 containers are suspended, busy or not, force
    // or default.
    let g = decide(&[
        t(30, DEFAULT, 0, true),
        t(50, DEFAULT, 1, true),
        t(20, FORCE, 1, false),
    ]);
    assert_eq!(g[0].unwrap().bp, FULL_BP * 30 / 30);
    assert_eq!(
        g[1],
        Some(Grant {
            bp: 0,
            held: true,
            lent: false
        })
    );
    assert_eq!(
        g[2],
        Some(Grant {
            bp: 0,
            held: true,
            lent: false
        })
    );
    // The high one idle: the low one runs, and lends the whole GPU.
    assert_eq!(
        bps(&[t(30, DEFAULT, 0, false), t(50, DEFAULT, 1, true)]),
        vec![Some(3000), Some(FULL_BP)]
    );
    // Same priority: no hold, shares split.
    assert_eq!(
        bps(&[t(30, DEFAULT, 0, true), t(50, DEFAULT, 0, true)]),
        vec![Some(3750), Some(6250)]
    );
    // A busy high-priority container without a share still holds the lower ones.
    assert_eq!(
        bps(&[t(0, DEFAULT, 0, true), t(50, DEFAULT, 1, true)]),
        vec![None, Some(0)]
    );
}

fn obs(region: u64, sm: u32, prio: u32, consumed: u64, grant: u32) -> Observed {
    Observed {
        region,
        dev: 0,
        gpu: [7; 16],
        sm_limit: sm,
        policy: DEFAULT,
        priority: prio,
        consumed_ns: consumed,
        throttled: 0,
        grant,
    }
}

#[test]
fn the_arbiter_sees_who_is_busy_and_what_was_tampered_with() {
    let mut a = Arbiter::new();
    let ms = 1_000_000u64;
    let mut now = 1_000 * ms;
    // First sight: nobody is known busy yet.
    let d = a.tick(now, &[obs(1, 30, 1, 5, 0), obs(2, 50, 1, 9, 0)]);
    assert_eq!(
        d.iter().map(|d| d.grant.bp).collect::<Vec<_>>(),
        vec![3000, 5000]
    );
    assert!(d.iter().all(|d| !d.tampered), "nothing written before");
    let w1 = encode_grant(d[0].grant);
    let w2 = encode_grant(d[1].grant);
    // Container 1 used the GPU: it gets all of it.
    now += 100 * ms;
    let d = a.tick(now, &[obs(1, 30, 1, 500, w1), obs(2, 50, 1, 9, w2)]);
    assert_eq!(d[0].grant.bp, FULL_BP);
    assert!(d[0].busy && !d[1].busy);
    let w1 = encode_grant(d[0].grant);
    // Both busy: proportional. Container 2 wrote its own word: tampering.
    now += 100 * ms;
    let d = a.tick(now, &[obs(1, 30, 1, 900, w1), obs(2, 50, 1, 99, w1)]);
    assert_eq!(d[0].grant.bp, 3750);
    assert_eq!(d[1].grant.bp, 6250);
    assert!(!d[0].tampered && d[1].tampered);
    // Container 2 stops: after the busy window it is idle again and 1 gets it all.
    let (w1, w2) = (encode_grant(d[0].grant), encode_grant(d[1].grant));
    now += BUSY_WINDOW_NS + ms;
    let d = a.tick(now, &[obs(1, 30, 1, 1900, w1), obs(2, 50, 1, 99, w2)]);
    assert_eq!(d[0].grant.bp, FULL_BP);
    assert_eq!(d[1].grant.bp, 5000);
    // Another GPU's containers are decided apart; an unknown GPU is not arbitrated.
    let mut o = obs(3, 30, 0, 0, 0);
    o.gpu = [9; 16];
    let mut u = obs(4, 30, 0, 0, 0);
    u.gpu = [0; 16];
    let d = a.tick(now, &[obs(1, 30, 1, 2900, 0), o, u]);
    assert_eq!(d.len(), 2);
}

#[test]
fn turns_are_self_checking_words_and_open_windows() {
    let t = Turn {
        start: 93,
        len: 156,
    };
    assert_eq!(decode_turn(encode_turn(Some(t))), Some(t));
    assert_eq!(encode_turn(None), 0);
    assert_eq!(decode_turn(0), None, "no turn");
    let w = encode_turn(Some(t));
    assert_eq!(decode_turn(w ^ 1), None, "torn");
    assert_eq!(decode_turn(w & 0xffff), None, "half written");
    let lo = 200u32 | 100 << 8;
    assert_eq!(
        decode_turn(lo | (!lo & 0xffff) << 16),
        None,
        "past the period"
    );
    let lo = 10u32;
    assert_eq!(decode_turn(lo | (!lo & 0xffff) << 16), None, "empty");
    // The window: 93..249 units of 160 us after each multiple of the period.
    let p = 100 * TURN_PERIOD_NS;
    let (s, e) = (93 * Turn::UNIT_NS, 249 * Turn::UNIT_NS);
    assert_eq!(t.wait_ns(p, 0), s, "before it: until it opens");
    assert_eq!(t.wait_ns(p + s, 1_000_000), 0, "open");
    assert_eq!(
        t.wait_ns(p + e - 500_000, 1_000_000),
        TURN_PERIOD_NS - (e - 500_000) + s
    );
    assert_eq!(
        t.wait_ns(p + e - 1_000_000, 1_000_000),
        0,
        "just ends in it"
    );
    assert_eq!(
        t.wait_ns(p + e + 1, 0),
        TURN_PERIOD_NS - (e + 1) + s,
        "after it: the next one"
    );
    // Work longer than half the turn may start in its first half.
    let half = (e - s) / 2;
    assert_eq!(t.wait_ns(p + s + half - 1, u64::MAX), 0);
    assert!(t.wait_ns(p + s + half + 1, u64::MAX) > 0);
    // A stale decision keeps no turn.
    assert_eq!(turn_at(w, p, p + GRANT_TTL_NS), Some(t));
    assert_eq!(turn_at(w, p, p + GRANT_TTL_NS + 1), None);
    assert_eq!(turn_at(w, 0, p), None);
}

#[test]
fn contending_containers_take_turns_in_proportion_to_their_grants() {
    let turns = assign_turns(&[3750, 6250]);
    assert_eq!(
        turns,
        vec![
            // 93.75 and 156.25 units: the unit rounding leaves over goes to the larger
            // remainder, so the period is all someone's.
            Some(Turn { start: 0, len: 94 }),
            Some(Turn {
                start: 94,
                len: 156
            })
        ]
    );
    // force 30 / 50: the rest of the period is no one's.
    assert_eq!(
        assign_turns(&[3000, 5000]),
        vec![
            Some(Turn { start: 0, len: 75 }),
            Some(Turn {
                start: 75,
                len: 125
            })
        ]
    );
    // Three that fill the GPU (3333 + 3333 + 3334 bp: 83.325, 83.325 and 83.35 units): the
    // one unit left goes to the largest remainder, the period is covered end to end.
    let three = assign_turns(&[3333, 3333, 3334]);
    assert_eq!(
        three.iter().map(|t| t.unwrap().len).collect::<Vec<_>>(),
        vec![83, 83, 84]
    );
    assert_eq!(three[2].unwrap().start + three[2].unwrap().len, 250);
    // Oversubscribed: scaled into the period, never past it.
    let o = assign_turns(&[6000, 7000]);
    let last = o[1].unwrap();
    assert!(
        u32::from(last.start) + u32::from(last.len) <= TURN_UNITS,
        "{o:?}"
    );
    // One alone, or a held one: no turns.
    assert_eq!(assign_turns(&[FULL_BP]), vec![None]);
    assert_eq!(assign_turns(&[5000, 0]), vec![None, None]);

    // Who takes turns: busy, contending, not held, with a share.
    let ts = [
        t(30, DEFAULT, 1, true),
        t(50, DEFAULT, 1, true),
        t(20, DEFAULT, 1, true),
    ];
    let g = decide(&ts);
    let tu = turns_for(&ts, &g, |k| k != 2);
    assert!(
        tu[0].is_some() && tu[1].is_some() && tu[2].is_none(),
        "{tu:?}"
    );
    // Only one contends: nobody takes turns (it may submit at any time).
    assert_eq!(turns_for(&ts, &g, |k| k == 0), vec![None; 3]);
    // A busy neighbour without a share ignores turns: none are given.
    let ts = [
        t(30, DEFAULT, 1, true),
        t(50, DEFAULT, 1, true),
        t(0, DEFAULT, 1, true),
    ];
    assert_eq!(turns_for(&ts, &decide(&ts), |_| true), vec![None; 3]);
    // Held ones take no turn.
    let ts = [
        t(30, DEFAULT, 0, true),
        t(50, DEFAULT, 1, true),
        t(20, DEFAULT, 1, true),
    ];
    assert_eq!(turns_for(&ts, &decide(&ts), |_| true), vec![None; 3]);
}

#[test]
fn the_arbiter_gives_turns_while_containers_wait_at_their_gates() {
    let mut a = Arbiter::new();
    let ms = 1_000_000u64;
    let mut now = 1_000 * ms;
    let at = |r, consumed, throttled| Observed {
        throttled,
        ..obs(r, if r == 1 { 30 } else { 50 }, 1, consumed, 0)
    };
    a.tick(now, &[at(1, 0, 0), at(2, 0, 0)]);
    // Both use the GPU (all of their shares: 30 and 50 ms in 100 ms), neither waits: no
    // turns.
    now += 100 * ms;
    let (mut c1, mut c2) = (30 * ms, 50 * ms);
    let d = a.tick(now, &[at(1, c1, 0), at(2, c2, 0)]);
    assert!(d.iter().all(|d| d.turn.is_none()), "{d:?}");
    // Both wait at their gates and use their grants (37.5 / 62.5 ms in 100 ms): turns in
    // proportion.
    now += 100 * ms;
    c1 += 37 * ms;
    c2 += 62 * ms;
    let d = a.tick(now, &[at(1, c1, 5), at(2, c2, 5)]);
    assert_eq!(d[0].turn, Some(Turn { start: 0, len: 94 }));
    assert_eq!(
        d[1].turn,
        Some(Turn {
            start: 94,
            len: 156
        })
    );
    // Container 1 keeps waiting (for its turn) but uses a tenth of its grant (an
    // inference server between bursts): after the window it is let out of turns, and
    // with one contender left nobody takes turns.
    for i in 6..10 {
        now += 100 * ms;
        c1 += 4 * ms;
        c2 += 62 * ms;
        a.tick(now, &[at(1, c1, i), at(2, c2, i)]);
    }
    now += 100 * ms;
    let d = a.tick(now, &[at(1, c1 + 4 * ms, 10), at(2, c2 + 62 * ms, 10)]);
    assert!(d.iter().all(|d| d.turn.is_none()), "{d:?}");
    // One stops waiting altogether: no turns either.
    let mut b = Arbiter::new();
    let mut now = 1_000 * ms;
    b.tick(now, &[at(1, 0, 0), at(2, 0, 0)]);
    now += 100 * ms;
    let d = b.tick(now, &[at(1, 38 * ms, 5), at(2, 62 * ms, 5)]);
    assert!(d.iter().all(|d| d.turn.is_some()), "{d:?}");
    now += BUSY_WINDOW_NS + ms;
    let d = b.tick(now, &[at(1, 200 * ms, 5), at(2, 300 * ms, 9)]);
    assert!(d.iter().all(|d| d.turn.is_none()), "{d:?}");
}
