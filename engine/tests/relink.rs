//! Relink link scenarios over real TCP socket pairs on 127.0.0.1, and the
//! blocking TCP driver.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use efapoll::relink::{
    self, Accepted, Acceptor, AutoReconnect, ChannelId, ChannelIdError, CommandError,
    ConnectorConfig, Event, HandshakeError, Incoming, Keepalive, Limits, Link, LinkError, Listener,
    Options, Params, Reconnect, TcpError, WireError,
};

const ENDPOINT: &str = "setup";

/// A channel id, as events and errors name it.
fn ch(id: u64) -> ChannelId {
    id.into()
}
const DEADLINE: Duration = Duration::from_secs(2);

/// Two connected, non-blocking streams.
fn socket_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let connector = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (accepted, _) = listener.accept().unwrap();
    for stream in [&connector, &accepted] {
        stream.set_nodelay(true).unwrap();
        stream.set_nonblocking(true).unwrap();
    }
    (connector, accepted)
}

fn write_all(stream: &mut TcpStream, mut bytes: &[u8]) {
    let deadline = Instant::now() + DEADLINE;
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "write stalled");
                thread::yield_now();
            }
            Err(e) => panic!("write: {e}"),
        }
    }
}

/// Whatever is readable now, up to `max` bytes; `None` at end of stream.
fn read_now(stream: &mut TcpStream, max: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0; 4096];
    while out.len() < max {
        let want = buf.len().min(max - out.len());
        match stream.read(&mut buf[..want]) {
            Ok(0) => return if out.is_empty() { None } else { Some(out) },
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("read: {e}"),
        }
    }
    Some(out)
}

/// One side of a link under test: the link, its stream, and every event.
struct Peer {
    link: Link,
    stream: TcpStream,
    events: Vec<Event>,
}

impl Peer {
    fn transmit(&mut self) -> usize {
        let mut out = Vec::new();
        let n = self.link.poll_transmit(&mut out);
        write_all(&mut self.stream, &out);
        n
    }

    /// Feeds what is readable; returns the bytes read.
    fn receive(&mut self) -> Result<usize, LinkError> {
        let bytes = read_now(&mut self.stream, usize::MAX).unwrap_or_default();
        self.link.handle_input(&bytes)?;
        while let Some(event) = self.link.poll_event() {
            self.events.push(event);
        }
        Ok(bytes.len())
    }

    fn messages(&self) -> Vec<(u64, u32, Vec<Vec<u8>>)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Message { channel, seq, parts } => {
                    Some((channel.to_u64().expect("a numeric id"), *seq, parts.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn count(&self, wanted: &Event) -> usize {
        self.events.iter().filter(|e| *e == wanted).count()
    }

    /// Consumes every message received so far.
    fn consume_all(&mut self) {
        for (channel, seq, _) in self.messages() {
            let _ = self.link.consume(channel, seq);
        }
    }
}

/// Moves bytes both ways until `done` holds; panics after the deadline.
fn drive(a: &mut Peer, b: &mut Peer, mut done: impl FnMut(&Peer, &Peer) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let sent = a.transmit() + b.transmit();
        let read = a.receive().unwrap() + b.receive().unwrap();
        if done(a, b) {
            return;
        }
        assert!(Instant::now() < deadline, "scenario did not finish");
        if sent + read == 0 {
            thread::yield_now();
        }
    }
}

/// Runs the listener's handshake on `stream` while pumping the connector.
fn handshake(
    connector: &mut Link,
    connector_stream: &mut TcpStream,
    listener_stream: &mut TcpStream,
    instance: &mut Listener,
) -> Result<Accepted, HandshakeError> {
    let mut acceptor = Acceptor::new();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut out = Vec::new();
        connector.poll_transmit(&mut out);
        write_all(connector_stream, &out);
        let bytes = read_now(listener_stream, usize::MAX).unwrap_or_default();
        let result = acceptor.handle_input(&bytes, instance);
        let mut reply = Vec::new();
        acceptor.poll_transmit(&mut reply);
        write_all(listener_stream, &reply);
        if let Some(accepted) = result? {
            return Ok(accepted);
        }
        if let Some(bytes) = read_now(connector_stream, usize::MAX) {
            connector.handle_input(&bytes).map_err(|e| match e {
                LinkError::Handshake(e) => e,
                e => panic!("connector: {e}"),
            })?;
        }
        assert!(Instant::now() < deadline, "handshake did not finish");
        thread::yield_now();
    }
}

fn connector_config(params: Params, limits: Limits) -> ConnectorConfig {
    ConnectorConfig { endpoint_name: ENDPOINT.to_owned(), params, limits }
}

/// A connected pair: the connector and the listener.
fn establish(params: Params, limits: Limits, instance: &mut Listener) -> (Peer, Peer) {
    let (mut cs, mut ls) = socket_pair();
    let mut link = Link::connect(connector_config(params, limits)).unwrap();
    let accepted = handshake(&mut link, &mut cs, &mut ls, instance).unwrap();
    assert!(!accepted.resumed);
    let listener_link = Link::accept(accepted, limits).unwrap();
    let mut connector = Peer { link, stream: cs, events: Vec::new() };
    let mut listener = Peer { link: listener_link, stream: ls, events: Vec::new() };
    drive(&mut connector, &mut listener, |c, _| c.link.is_open());
    (connector, listener)
}

fn default_pair() -> (Peer, Peer, Listener) {
    let mut instance = Listener::new([ENDPOINT], Params::default());
    let (c, l) = establish(Params::default(), Limits::default(), &mut instance);
    (c, l, instance)
}

/// Both streams break; the connector dials again and the listener resumes.
fn reconnect(connector: &mut Peer, listener: &mut Peer, instance: &mut Listener) -> bool {
    connector.link.stream_lost();
    listener.link.stream_lost();
    let (mut cs, mut ls) = socket_pair();
    connector.link.reconnect(false).unwrap();
    let accepted = handshake(&mut connector.link, &mut cs, &mut ls, instance).unwrap();
    let resumed = accepted.resumed;
    if resumed {
        listener.link.resume(accepted).unwrap();
    } else {
        listener.link = Link::accept(accepted, Limits::default()).unwrap();
    }
    connector.stream = cs;
    listener.stream = ls;
    drive(connector, listener, |c, _| c.link.is_open());
    resumed
}

// ---- handshake ----

#[test]
fn handshake_connects_with_new_link_id_and_epoch() {
    let mut instance =
        Listener::new([ENDPOINT], Params::default()).with_epoch(1_700_000_000_000_000);
    let (c, l) = establish(Params::default(), Limits::default(), &mut instance);
    assert_eq!(c.link.link_id(), l.link.link_id());
    assert!((1..1 << 63).contains(&c.link.link_id()));
    assert_eq!(c.link.epoch(), 1_700_000_000_000_000);
    let connected =
        Event::Connected { link_id: c.link.link_id(), epoch: c.link.epoch(), resumed: false };
    assert_eq!(c.events, std::slice::from_ref(&connected));
    assert_eq!(l.events, [connected]);
    // Link ids within one instance are unique.
    let (c2, _) = establish(Params::default(), Limits::default(), &mut instance);
    assert_ne!(c2.link.link_id(), c.link.link_id());
}

#[test]
fn handshake_with_unsupported_version_terminates() {
    // A listener answering a version we do not speak.
    let (mut cs, mut ls) = socket_pair();
    let mut link = Link::connect(connector_config(Params::default(), Limits::default())).unwrap();
    let mut out = Vec::new();
    link.poll_transmit(&mut out);
    assert_eq!(out, [0; 8]);
    write_all(&mut cs, &out);
    write_all(&mut ls, &[1, 0, 0, 0, 0, 0, 0, 0]);
    let deadline = Instant::now() + DEADLINE;
    let reply = loop {
        let bytes = read_now(&mut cs, usize::MAX).unwrap();
        if !bytes.is_empty() {
            break bytes;
        }
        assert!(Instant::now() < deadline);
        thread::yield_now();
    };
    assert_eq!(
        link.handle_input(&reply),
        Err(LinkError::Handshake(HandshakeError::VersionUnsupported(1)))
    );
    assert!(!link.is_open());
    assert_eq!(link.handle_input(&[0; 16]), Err(LinkError::NoStream));

    // A connector offering a higher version gets ours, the lower one.
    let mut instance = Listener::new([ENDPOINT], Params::default());
    let mut acceptor = Acceptor::new();
    assert_eq!(acceptor.handle_input(&[7, 0, 0, 0, 0, 0, 0, 0], &mut instance), Ok(None));
    let mut reply = Vec::new();
    acceptor.poll_transmit(&mut reply);
    assert_eq!(reply, [0; 8]);
}

#[test]
fn handshake_with_unknown_name_terminates() {
    let (mut cs, mut ls) = socket_pair();
    let mut instance = Listener::new(["other", "names"], Params::default());
    let mut link = Link::connect(connector_config(Params::default(), Limits::default())).unwrap();
    let result = handshake(&mut link, &mut cs, &mut ls, &mut instance);
    assert_eq!(result, Err(HandshakeError::UnknownEndpoint(ENDPOINT.to_owned())));
    // The listener closes; the connector sees the end of the stream.
    drop(ls);
    let deadline = Instant::now() + DEADLINE;
    while read_now(&mut cs, usize::MAX).is_some() {
        assert!(Instant::now() < deadline);
        thread::yield_now();
    }
    assert!(!link.is_open());
}

#[test]
fn handshake_with_different_params_terminates() {
    for theirs in [
        Params { connector_id_len: 2, ..Params::default() },
        Params { listener_id_len: 8, ..Params::default() },
        Params { connector_transactions: true, ..Params::default() },
        Params { listener_transactions: true, ..Params::default() },
    ] {
        let (mut cs, mut ls) = socket_pair();
        let mut instance = Listener::new([ENDPOINT], Params::default());
        let mut link = Link::connect(connector_config(theirs, Limits::default())).unwrap();
        assert_eq!(
            handshake(&mut link, &mut cs, &mut ls, &mut instance),
            Err(HandshakeError::ParamsMismatch { ours: Params::default(), theirs })
        );
    }
}

#[test]
fn zero_link_id_unasked_terminates() {
    let (mut cs, mut ls) = socket_pair();
    let mut link = Link::connect(connector_config(Params::default(), Limits::default())).unwrap();
    let mut out = Vec::new();
    link.poll_transmit(&mut out);
    write_all(&mut cs, &out);
    // A listener that answers version 0, then replies with link id zero.
    write_all(&mut ls, &[0; 8]);
    write_all(&mut ls, &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let deadline = Instant::now() + DEADLINE;
    let mut received = Vec::new();
    while received.len() < 24 {
        received.extend(read_now(&mut cs, usize::MAX).unwrap());
        assert!(Instant::now() < deadline);
    }
    assert_eq!(link.handle_input(&received), Err(LinkError::Handshake(HandshakeError::ZeroLinkId)));
}

#[test]
fn out_of_range_link_id_terminates() {
    let mut link = Link::connect(connector_config(Params::default(), Limits::default())).unwrap();
    let mut reply = vec![0; 8];
    reply.extend_from_slice(&[0; 8]);
    reply.extend_from_slice(&(1u64 << 63).to_le_bytes());
    assert_eq!(
        link.handle_input(&reply),
        Err(LinkError::Handshake(HandshakeError::Wire(WireError::LinkIdOutOfRange(1 << 63))))
    );
}

#[test]
fn required_old_link_unknown_gets_zero_and_terminates() {
    let (mut c, mut l, mut instance) = default_pair();
    let old = c.link.link_id();
    // The listener instance restarts: new epoch, no links.
    let mut restarted = Listener::new([ENDPOINT], Params::default());
    assert_ne!(restarted.epoch(), instance.epoch());
    c.link.stream_lost();
    l.link.stream_lost();
    let (mut cs, mut ls) = socket_pair();
    c.link.reconnect(true).unwrap();
    let mut acceptor_result = None;
    let mut connector_result = Ok(());
    let deadline = Instant::now() + DEADLINE;
    let mut acceptor = Acceptor::new();
    while connector_result.is_ok() {
        let mut out = Vec::new();
        c.link.poll_transmit(&mut out);
        write_all(&mut cs, &out);
        let bytes = read_now(&mut ls, usize::MAX).unwrap_or_default();
        let result = acceptor.handle_input(&bytes, &mut restarted);
        if result != Ok(None) {
            acceptor_result = Some(result);
        }
        let mut reply = Vec::new();
        acceptor.poll_transmit(&mut reply);
        write_all(&mut ls, &reply);
        connector_result = c.link.handle_input(&read_now(&mut cs, usize::MAX).unwrap_or_default());
        assert!(Instant::now() < deadline);
    }
    assert_eq!(acceptor_result, Some(Err(HandshakeError::LinkLost(old))));
    assert_eq!(connector_result, Err(LinkError::Handshake(HandshakeError::LinkLost(old))));
    // A resuming handshake cannot start a new link.
    let (mut cs, mut ls) = socket_pair();
    c.link.reconnect(true).unwrap();
    let accepted = handshake(&mut c.link, &mut cs, &mut ls, &mut instance).unwrap();
    assert!(accepted.resumed);
    assert_eq!(
        Link::accept(accepted.clone(), Limits::default()).err(),
        Some(LinkError::NotNew(old))
    );
    l.link.resume(accepted).unwrap();
    // The original instance still knows the link: requiring it works there.
    assert!(instance.knows(old));
    instance.forget(old);
    assert!(!instance.knows(old));
}

// ---- messaging ----

#[test]
fn messages_are_delivered_in_order_and_acknowledged() {
    let (mut c, mut l, _instance) = default_pair();
    for i in 0..20u32 {
        let channel = u64::from(i % 3);
        let seq = c.link.send(channel, &[b"part", &i.to_le_bytes()]).unwrap();
        assert_eq!(seq, i / 3);
    }
    l.link.send(7, &[b"back"]).unwrap();
    assert_eq!(c.link.unacknowledged(), 20);
    drive(&mut c, &mut l, |c, l| {
        l.messages().len() == 20 && c.messages().len() == 1 && c.link.unacknowledged() == 0
    });
    let messages = l.messages();
    for channel in 0..3u64 {
        let on_channel: Vec<_> = messages.iter().filter(|m| m.0 == channel).collect();
        for (expected_seq, (_, seq, parts)) in on_channel.iter().enumerate() {
            assert_eq!(*seq, expected_seq as u32);
            let i = u32::from_le_bytes(parts[1].clone().try_into().unwrap());
            assert_eq!(u64::from(i % 3), channel);
            assert_eq!(i / 3, *seq);
            assert_eq!(parts[0], b"part");
        }
    }
    assert_eq!(c.messages(), [(7, 0, vec![b"back".to_vec()])]);

    // Received is not consumed: the window refills only on consumption.
    let window = Limits::default().send_window;
    assert_eq!(c.link.send_window(0), window - 7);
    l.consume_all();
    drive(&mut c, &mut l, |c, _| c.link.send_window(0) == window);
    assert_eq!(c.link.send_window(1), window);
}

#[test]
fn multicast_numbers_each_channel_and_repeats_repeated_ids() {
    let (mut c, mut l, _instance) = default_pair();
    c.link.send(2, &[b"first"]).unwrap();
    c.link.send_multicast(&[1, 2, 2], &[b"all", b""]).unwrap();
    drive(&mut c, &mut l, |_, l| l.messages().len() == 4);
    let all = vec![b"all".to_vec(), Vec::new()];
    assert_eq!(
        l.messages(),
        [(2, 0, vec![b"first".to_vec()]), (1, 0, all.clone()), (2, 1, all.clone()), (2, 2, all),]
    );
}

/// Messages in a burst: beyond the 1,024 window this link once had,
/// within the reference implementation's 65,536.
const BURST: u32 = 10_000;

#[test]
fn a_burst_of_ten_thousand_on_one_channel_arrives_whole_and_in_order() {
    let (mut c, mut l, _instance) = default_pair();
    for i in 0..BURST {
        assert_eq!(c.link.send(1, &[&i.to_le_bytes()]), Ok(i));
    }
    let count = |p: &Peer| p.events.iter().filter(|e| matches!(e, Event::Message { .. })).count();
    drive(&mut c, &mut l, |c, l| count(l) == BURST as usize && c.link.unacknowledged() == 0);
    for (i, (channel, seq, parts)) in l.messages().into_iter().enumerate() {
        assert_eq!((channel, seq, parts), (1, i as u32, vec![(i as u32).to_le_bytes().to_vec()]));
    }
    // Nothing consumed yet: the window is what is left of 65,536.
    assert_eq!(c.link.send_window(1), Limits::default().send_window - BURST);
    l.consume_all();
    drive(&mut c, &mut l, |c, _| c.link.send_window(1) == Limits::default().send_window);
}

#[test]
fn full_window_blocks_until_consumed() {
    let limits = Limits { send_window: 4, ..Limits::default() };
    let mut instance = Listener::new([ENDPOINT], Params::default());
    let (mut c, mut l) = establish(Params::default(), limits, &mut instance);
    for _ in 0..4 {
        c.link.send(5, &[b"x"]).unwrap();
    }
    assert_eq!(c.link.send(5, &[b"x"]), Err(CommandError::Blocked { channel: ch(5) }));
    // Other channels have their own window.
    c.link.send(6, &[b"y"]).unwrap();
    drive(&mut c, &mut l, |c, _| c.link.unacknowledged() == 0);
    assert_eq!(c.link.send_window(5), 0);
    l.link.consume(5, 1).unwrap();
    assert_eq!(l.link.consume(5, 1), Err(CommandError::NoSuchMessage { channel: ch(5), seq: 1 }));
    assert_eq!(l.link.consume(5, 9), Err(CommandError::NoSuchMessage { channel: ch(5), seq: 9 }));
    drive(&mut c, &mut l, |c, _| c.link.send_window(5) == 2);
    c.link.send(5, &[b"z"]).unwrap();
}

#[test]
fn command_checks() {
    let (mut c, _l, _instance) = default_pair();
    assert_eq!(
        c.link.send(1 << 32, &[b"x"]),
        Err(CommandError::ChannelIdTooWide { channel: ch(1 << 32), len: 4 })
    );
    assert_eq!(c.link.commit(0), Err(CommandError::TransactionsNotNegotiated));
    assert_eq!(c.link.close(3), Err(CommandError::ChannelNotOpen { channel: ch(3) }));
    let big = vec![0; 17 << 20];
    assert!(matches!(c.link.send(0, &[&big]), Err(CommandError::MessageTooLong { .. })));
    assert_eq!(c.link.unacknowledged(), 0);
}

/// The widest id of `len` bytes: each byte used (1, 2, 3, ...).
fn widest_id(len: u8) -> ChannelId {
    ChannelId::from_le_bytes(&(1..=len).collect::<Vec<u8>>()).unwrap()
}

#[test]
fn channel_ids_of_9_64_and_255_bytes_carry_messages() {
    for len in [9, 64, 255] {
        // relink 1: each direction's id size, agreed in the handshake.
        let params = Params { connector_id_len: len, listener_id_len: len, ..Params::default() };
        let mut instance = Listener::new([ENDPOINT], params);
        let (mut c, mut l) = establish(params, Limits::default(), &mut instance);
        let wide = widest_id(len);
        assert_eq!(c.link.send(&wide, &[b"wide"]), Ok(0));
        // A number is an id of any size, zero-extended.
        assert_eq!(c.link.send(7, &[b"seven"]), Ok(0));
        c.link.send_multicast(&[wide.clone(), ch(7)], &[b"both"]).unwrap();
        l.link.send(&wide, &[b"back"]).unwrap();
        let messages = |p: &Peer| -> Vec<(ChannelId, u32, Vec<u8>)> {
            p.events
                .iter()
                .filter_map(|e| match e {
                    Event::Message { channel, seq, parts } => {
                        Some((channel.clone(), *seq, parts[0].clone()))
                    }
                    _ => None,
                })
                .collect()
        };
        drive(&mut c, &mut l, |c, l| {
            messages(l).len() == 4 && messages(c).len() == 1 && c.link.unacknowledged() == 0
        });
        assert_eq!(
            messages(&l),
            [
                (wide.clone(), 0, b"wide".to_vec()),
                (ch(7), 0, b"seven".to_vec()),
                (wide.clone(), 1, b"both".to_vec()),
                (ch(7), 1, b"both".to_vec()),
            ]
        );
        assert_eq!(messages(&c), [(wide.clone(), 0, b"back".to_vec())]);
        // Consumption, closure and its confirmation name the wide id too.
        l.link.consume(&wide, 1).unwrap();
        c.link.close(&wide).unwrap();
        drive(&mut c, &mut l, |c, _| c.events.contains(&Event::Closed { channel: wide.clone() }));
        assert!(l.events.contains(&Event::PeerClosed { channel: wide.clone() }));
        assert_eq!(c.link.send_window(&wide), Limits::default().send_window);
        // An id wider than the size is refused, not cut.
        if len < 255 {
            let wider = widest_id(len + 1);
            assert_eq!(
                c.link.send(&wider, &[b"x"]),
                Err(CommandError::ChannelIdTooWide { channel: wider, len })
            );
        }
    }
    // relink 1: an id size is one byte, so 256 bytes are no id.
    assert_eq!(ChannelId::from_le_bytes(&[1; 256]), Err(ChannelIdError::TooLong { len: 256 }));
}

#[test]
fn ping_gets_one_pong_each() {
    let (mut c, mut l, _instance) = default_pair();
    for _ in 0..3 {
        c.link.ping().unwrap();
    }
    l.link.ping().unwrap();
    drive(&mut c, &mut l, |c, l| c.count(&Event::Pong) == 3 && l.count(&Event::Pong) == 1);
}

#[test]
fn transactions_commit_and_rollback() {
    let params = Params { connector_transactions: true, ..Params::default() };
    let mut instance = Listener::new([ENDPOINT], params);
    let (mut c, mut l) = establish(params, Limits::default(), &mut instance);
    assert_eq!(c.link.commit(0), Err(CommandError::NothingToCommit { channel: ch(0) }));
    for _ in 0..3 {
        c.link.send(0, &[b"t1"]).unwrap();
    }
    assert_eq!(c.link.commit(0), Ok(2));
    assert_eq!(c.link.commit(0), Err(CommandError::NothingToCommit { channel: ch(0) }));
    c.link.send(0, &[b"t2"]).unwrap();
    assert_eq!(c.link.rollback(0), Ok(3));
    c.link.send(0, &[b"t3"]).unwrap();
    assert_eq!(c.link.commit(0), Ok(4));
    // The listener's channels do not use transactions.
    assert_eq!(l.link.commit(0), Err(CommandError::TransactionsNotNegotiated));

    drive(&mut c, &mut l, |_, l| l.events.contains(&Event::Commit { channel: ch(0), seq: 4 }));
    let transactions: Vec<_> = l
        .events
        .iter()
        .filter(|e| matches!(e, Event::Commit { .. } | Event::Rollback { .. }))
        .cloned()
        .collect();
    assert_eq!(
        transactions,
        [
            Event::Commit { channel: ch(0), seq: 2 },
            Event::Rollback { channel: ch(0), seq: 3 },
            Event::Commit { channel: ch(0), seq: 4 },
        ]
    );
    // Outcomes in commit order.
    assert_eq!(
        l.link.resolve_commit(0, 4, true),
        Err(CommandError::NoPendingCommit { channel: ch(0), seq: 4 })
    );
    l.link.resolve_commit(0, 2, true).unwrap();
    l.link.resolve_commit(0, 4, false).unwrap();
    drive(&mut c, &mut l, |c, _| c.events.contains(&Event::Uncommitted { channel: ch(0), seq: 4 }));
    assert!(c.events.contains(&Event::Committed { channel: ch(0), seq: 2 }));
}

#[test]
fn close_is_confirmed_once_consumed_and_sending_reopens_from_zero() {
    let (mut c, mut l, _instance) = default_pair();
    let closed = Event::Closed { channel: ch(9) };
    let peer_closed = Event::PeerClosed { channel: ch(9) };
    for round in 0..3 {
        // relink 3.1: every opening of the channel numbers from 0.
        assert_eq!(c.link.send(9, &[b"a"]), Ok(0));
        assert_eq!(c.link.send(9, &[b"b"]), Ok(1));
        c.link.close(9).unwrap();
        assert_eq!(c.link.send(9, &[b"c"]), Err(CommandError::ChannelClosing { channel: ch(9) }));
        drive(&mut c, &mut l, |c, l| {
            l.count(&peer_closed) == round + 1 && c.link.unacknowledged() == 0
        });
        // Received, not consumed: the closure is not confirmed yet.
        assert_eq!(c.count(&closed), round);
        l.consume_all();
        drive(&mut c, &mut l, |c, _| c.count(&closed) == round + 1);
    }
    let round = [(9, 0, vec![b"a".to_vec()]), (9, 1, vec![b"b".to_vec()])];
    assert_eq!(l.messages(), round.iter().cycle().take(6).cloned().collect::<Vec<_>>());
}

/// 1-byte channel ids, so that the bytes below stay short.
fn one_byte_ids() -> Params {
    Params { connector_id_len: 1, listener_id_len: 1, ..Params::default() }
}

/// A message of one 1-byte part (relink 2.3.3: short, small).
fn raw_message(channel: u8, part: u8) -> Vec<u8> {
    vec![0x11, 1, channel, 0, 1, 0, 0, 0, part, 0, 0, 0, 0, 0, 0, 0]
}

/// A close operation (relink 2.3.1).
fn raw_close(channel: u8) -> Vec<u8> {
    vec![0x41, 0, channel, 0, 0, 0, 0, 0]
}

/// A closed acknowledgement (relink 2.3.1).
fn raw_closed(channel: u8) -> Vec<u8> {
    vec![0x85, 0, channel, 0, 0, 0, 0, 0]
}

const RECEIVED: u8 = 0;
const CONSUMED: u8 = 1;

/// A sequence acknowledgement through `seq` (relink 2.3.2), the form the
/// reference implementation always writes.
fn raw_seq_ack(ack: u8, channel: u8, seq: u32) -> Vec<u8> {
    let mut packet = vec![0x0d | ack << 5, 0, channel, 0];
    packet.extend_from_slice(&seq.to_le_bytes());
    packet
}

fn transmitted(link: &mut Link) -> Vec<u8> {
    let mut out = Vec::new();
    link.poll_transmit(&mut out);
    out
}

fn drain_events(link: &mut Link) -> Vec<Event> {
    std::iter::from_fn(|| link.poll_event()).collect()
}

#[test]
fn the_last_message_is_acknowledged_before_the_close_is_confirmed() {
    let mut link = open_listener_link(one_byte_ids());
    link.handle_input(&[raw_message(5, b'a'), raw_close(5)].concat()).unwrap();
    assert_eq!(
        drain_events(&mut link)[1..],
        [
            Event::Message { channel: ch(5), seq: 0, parts: vec![b"a".to_vec()] },
            Event::PeerClosed { channel: ch(5) },
        ]
    );
    // Received but not consumed: the confirmation waits, or the consumed
    // acknowledgement would follow it onto the reopened channel.
    assert_eq!(transmitted(&mut link), raw_seq_ack(RECEIVED, 5, 0));
    link.consume(5, 0).unwrap();
    assert_eq!(transmitted(&mut link), [raw_seq_ack(CONSUMED, 5, 0), raw_closed(5)].concat());
    // The peer reopens the channel: its first message is number 0 again.
    link.handle_input(&raw_message(5, b'b')).unwrap();
    assert_eq!(
        drain_events(&mut link),
        [Event::Message { channel: ch(5), seq: 0, parts: vec![b"b".to_vec()] }]
    );
    assert_eq!(transmitted(&mut link), raw_seq_ack(RECEIVED, 5, 0));
}

#[test]
fn a_reopened_channel_is_numbered_from_zero_on_the_wire() {
    let mut link = open_listener_link(one_byte_ids());
    drain_events(&mut link);
    assert_eq!(link.send(7, &[b"a"]), Ok(0));
    link.close(7).unwrap();
    assert_eq!(transmitted(&mut link), [raw_message(7, b'a'), raw_close(7)].concat());
    let acks = [raw_seq_ack(RECEIVED, 7, 0), raw_seq_ack(CONSUMED, 7, 0), raw_closed(7)];
    link.handle_input(&acks.concat()).unwrap();
    assert_eq!(drain_events(&mut link), [Event::Closed { channel: ch(7) }]);

    // Reopened: the peer acknowledges its first message as number 0.
    assert_eq!(link.send(7, &[b"b"]), Ok(0));
    link.close(7).unwrap();
    // Until the peer acknowledges a message of the reopened channel it may
    // repeat its confirmation of the first closure, which must not pass
    // for this one's: the close waits for that acknowledgement.
    // Nor does the shutdown packet go first: nothing may follow it.
    link.shutdown();
    assert_eq!(transmitted(&mut link), raw_message(7, b'b'));
    link.handle_input(&raw_closed(7)).unwrap();
    assert_eq!(drain_events(&mut link), []);
    link.handle_input(&raw_seq_ack(RECEIVED, 7, 0)).unwrap();
    assert_eq!(link.unacknowledged(), 0);
    let shutdown = [4 << 5, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(transmitted(&mut link), [&raw_close(7)[..], &shutdown].concat());
    link.handle_input(&[raw_seq_ack(CONSUMED, 7, 0), raw_closed(7)].concat()).unwrap();
    assert_eq!(drain_events(&mut link), [Event::Closed { channel: ch(7) }]);
    assert_eq!(link.send_window(7), Limits::default().send_window);
}

// ---- resumption ----

/// Payloads as delivered: (channel, seq, index carried in the message).
fn delivered(peer: &Peer) -> Vec<(u64, u32, u32)> {
    peer.messages()
        .into_iter()
        .map(|(channel, seq, parts)| {
            (channel, seq, u32::from_le_bytes(parts[0].clone().try_into().unwrap()))
        })
        .collect()
}

fn assert_exactly_once(peer: &Peer, channels: u64, per_channel: u32) {
    let got = delivered(peer);
    assert_eq!(got.len() as u32, channels as u32 * per_channel, "{got:?}");
    for channel in 0..channels {
        let seqs: Vec<_> = got.iter().filter(|m| m.0 == channel).map(|m| (m.1, m.2)).collect();
        let want: Vec<_> = (0..per_channel).map(|i| (i, i)).collect();
        assert_eq!(seqs, want, "channel {channel}");
    }
}

#[test]
fn stream_drop_mid_conversation_resumes_without_loss_or_duplicates() {
    let (mut c, mut l, mut instance) = default_pair();
    let link_id = c.link.link_id();
    for i in 0..30u32 {
        c.link.send(u64::from(i % 2), &[&(i / 2).to_le_bytes(), &[0xab; 37]]).unwrap();
    }
    for i in 0..10u32 {
        l.link.send(0, &[&i.to_le_bytes()]).unwrap();
    }
    // The connector writes everything; the listener reads only part of it,
    // cutting a packet, and its own packets never reach the connector.
    c.transmit();
    l.transmit();
    thread::sleep(Duration::from_millis(5));
    let partial = read_now(&mut l.stream, 700).unwrap();
    assert_eq!(partial.len(), 700);
    l.link.handle_input(&partial).unwrap();
    while let Some(event) = l.link.poll_event() {
        l.events.push(event);
    }
    let before = l.messages().len();
    assert!(before > 0 && before < 30, "{before} messages before the drop");
    l.transmit(); // acknowledgements that will be lost with the stream
    l.stream.shutdown(Shutdown::Both).unwrap();

    // More traffic while disconnected is queued.
    for i in 30..40u32 {
        c.link.send(u64::from(i % 2), &[&(i / 2).to_le_bytes()]).unwrap();
    }

    assert!(reconnect(&mut c, &mut l, &mut instance));
    assert_eq!(c.link.link_id(), link_id);
    assert!(c.events.contains(&Event::Connected {
        link_id,
        epoch: instance.epoch(),
        resumed: true
    }));
    drive(&mut c, &mut l, |c, l| {
        l.messages().len() == 40 && c.messages().len() == 10 && c.link.unacknowledged() == 0
    });
    assert_exactly_once(&l, 2, 20);
    assert_exactly_once(&c, 1, 10);
    assert!(c.events.contains(&Event::PeerResumed));
    assert!(l.events.contains(&Event::PeerResumed));

    // Consumption acknowledged across a second drop still refills windows.
    l.consume_all();
    assert!(reconnect(&mut c, &mut l, &mut instance));
    drive(&mut c, &mut l, |c, _| c.link.send_window(0) == Limits::default().send_window);
    // And nothing was delivered twice.
    assert_exactly_once(&l, 2, 20);
}

#[test]
fn repeated_drops_while_sending_lose_and_duplicate_nothing() {
    let (mut c, mut l, mut instance) = default_pair();
    let mut sent = 0u32;
    for round in 0..8 {
        for _ in 0..12 {
            c.link.send(0, &[&sent.to_le_bytes()]).unwrap();
            sent += 1;
        }
        c.transmit();
        thread::sleep(Duration::from_millis(1));
        // Read a varying share of what arrived before the stream breaks.
        let bytes = read_now(&mut l.stream, 40 + round * 37).unwrap_or_default();
        l.link.handle_input(&bytes).unwrap();
        while let Some(event) = l.link.poll_event() {
            l.events.push(event);
        }
        if round % 2 == 0 {
            l.transmit();
            let _ = c.receive();
        }
        l.consume_all();
        assert!(reconnect(&mut c, &mut l, &mut instance));
    }
    drive(&mut c, &mut l, |c, l| {
        l.messages().len() == sent as usize && c.link.unacknowledged() == 0
    });
    assert_exactly_once(&l, 1, sent);
}

#[test]
fn commits_and_close_survive_a_drop() {
    let params = Params { connector_transactions: true, ..Params::default() };
    let mut instance = Listener::new([ENDPOINT], params);
    let (mut c, mut l) = establish(params, Limits::default(), &mut instance);
    for _ in 0..2 {
        c.link.send(1, &[b"m"]).unwrap();
    }
    c.link.commit(1).unwrap();
    drive(&mut c, &mut l, |_, l| l.events.contains(&Event::Commit { channel: ch(1), seq: 1 }));
    // The outcome is decided, but the stream breaks before it is sent.
    l.link.resolve_commit(1, 1, true).unwrap();
    c.link.send(2, &[b"n"]).unwrap();
    c.link.close(2).unwrap();
    // Outcomes come before the closure's confirmation: nothing to commit.
    assert_eq!(c.link.commit(2), Err(CommandError::ChannelClosing { channel: ch(2) }));
    assert!(reconnect(&mut c, &mut l, &mut instance));
    drive(&mut c, &mut l, |_, l| l.events.contains(&Event::PeerClosed { channel: ch(2) }));
    // The closure is confirmed once channel 2's message is consumed.
    l.consume_all();
    drive(&mut c, &mut l, |c, _| {
        c.events.contains(&Event::Committed { channel: ch(1), seq: 1 })
            && c.events.contains(&Event::Closed { channel: ch(2) })
    });
    assert_eq!(l.count(&Event::Commit { channel: ch(1), seq: 1 }), 1);
    assert_eq!(l.count(&Event::PeerClosed { channel: ch(2) }), 1);
    assert_eq!(l.messages().len(), 3);
}

#[test]
fn close_and_reopen_survive_drops() {
    let (mut c, mut l, mut instance) = default_pair();
    let closed = Event::Closed { channel: ch(3) };
    let peer_closed = Event::PeerClosed { channel: ch(3) };
    // The listener confirms the closure, but the stream breaks before the
    // connector reads it: the confirmation is repeated after the
    // resumption, and the message is not delivered again.
    c.link.send(3, &[b"a"]).unwrap();
    c.link.close(3).unwrap();
    c.transmit();
    let deadline = Instant::now() + DEADLINE;
    while l.count(&peer_closed) == 0 {
        l.receive().unwrap();
        assert!(Instant::now() < deadline);
    }
    l.consume_all();
    l.transmit();
    assert!(reconnect(&mut c, &mut l, &mut instance));
    drive(&mut c, &mut l, |c, _| c.count(&closed) == 1);

    // Reopened, and the stream breaks before the listener reads the new
    // message: its repeated confirmation of the first closure neither
    // closes the new one nor stops the message, numbered 0 again.
    assert_eq!(c.link.send(3, &[b"b"]), Ok(0));
    c.link.close(3).unwrap();
    c.transmit();
    assert!(reconnect(&mut c, &mut l, &mut instance));
    drive(&mut c, &mut l, |c, l| l.count(&peer_closed) == 2 && c.link.unacknowledged() == 0);
    assert_eq!(c.count(&closed), 1);
    l.consume_all();
    drive(&mut c, &mut l, |c, _| c.count(&closed) == 2);
    assert_eq!(l.messages(), [(3, 0, vec![b"a".to_vec()]), (3, 0, vec![b"b".to_vec()])]);

    // Repeated once more after another drop, the confirmation changes nothing.
    assert!(reconnect(&mut c, &mut l, &mut instance));
    c.link.ping().unwrap();
    drive(&mut c, &mut l, |c, _| c.count(&Event::Pong) == 1);
    assert_eq!((c.count(&closed), l.count(&peer_closed)), (2, 2));
    assert_eq!(c.link.send(3, &[b"c"]), Ok(0));
    drive(&mut c, &mut l, |_, l| l.messages().len() == 3);
    assert_eq!(l.messages()[2], (3, 0, vec![b"c".to_vec()]));
}

/// A few rounds of moving bytes both ways, for what must not happen.
fn settle(a: &mut Peer, b: &mut Peer) {
    for _ in 0..5 {
        a.transmit();
        b.transmit();
        thread::sleep(Duration::from_millis(2));
        a.receive().unwrap();
        b.receive().unwrap();
    }
}

#[test]
fn acknowledgements_below_the_ack_window_wait_for_release_a_reconnection_or_shutdown() {
    let limits = Limits { ack_window: 8, ..Limits::default() };
    let mut instance = Listener::new([ENDPOINT], Params::default());
    let (mut c, mut l) = establish(Params::default(), limits, &mut instance);
    for _ in 0..3 {
        c.link.send(1, &[b"x"]).unwrap();
    }
    drive(&mut c, &mut l, |_, l| l.messages().len() == 3);
    settle(&mut c, &mut l);
    assert_eq!(c.link.unacknowledged(), 3);
    assert!(l.link.acks_held());
    l.link.release_acks();
    drive(&mut c, &mut l, |c, _| c.link.unacknowledged() == 0);
    assert!(!l.link.acks_held());

    // Consumed, held; a new stream tells the peer everything at once
    // (relink 3.5).
    l.consume_all();
    settle(&mut c, &mut l);
    assert_eq!(c.link.send_window(1), limits.send_window - 3);
    assert!(reconnect(&mut c, &mut l, &mut instance));
    drive(&mut c, &mut l, |c, _| c.link.send_window(1) == limits.send_window);

    // The window fills: acknowledged without a release.
    for _ in 0..8 {
        c.link.send(1, &[b"y"]).unwrap();
    }
    drive(&mut c, &mut l, |c, _| c.link.unacknowledged() == 0);
    l.consume_all();
    drive(&mut c, &mut l, |c, _| c.link.send_window(1) == limits.send_window);

    // Nothing held stays behind the shutdown packet.
    c.link.send(1, &[b"z"]).unwrap();
    drive(&mut c, &mut l, |_, l| l.messages().len() == 12);
    l.consume_all();
    settle(&mut c, &mut l);
    assert_eq!(c.link.send_window(1), limits.send_window - 1);
    l.link.shutdown();
    c.link.shutdown();
    drive(&mut c, &mut l, |c, l| c.link.is_done() && l.link.is_done());
    assert_eq!(c.link.send_window(1), limits.send_window);
}

#[test]
fn pongs_are_not_carried_across_a_reconnection() {
    let (mut c, mut l, mut instance) = default_pair();
    c.link.ping().unwrap();
    c.transmit();
    // The listener reads the ping but the stream breaks before its pong.
    let deadline = Instant::now() + DEADLINE;
    while l.link.poll_event().is_none() && l.receive().unwrap() == 0 {
        assert!(Instant::now() < deadline);
        thread::yield_now();
    }
    assert!(reconnect(&mut c, &mut l, &mut instance));
    c.link.send(0, &[b"after"]).unwrap();
    drive(&mut c, &mut l, |c, l| l.messages().len() == 1 && c.link.unacknowledged() == 0);
    assert_eq!(c.count(&Event::Pong), 0);
}

#[test]
fn new_epoch_discards_the_old_link() {
    let (mut c, mut l, _instance) = default_pair();
    let old = c.link.link_id();
    c.link.send(0, &[b"lost"]).unwrap();
    let mut restarted = Listener::new([ENDPOINT], Params::default());
    assert!(!reconnect(&mut c, &mut l, &mut restarted));
    assert_eq!(c.link.unacknowledged(), 0);
    assert!(c.events.contains(&Event::Connected {
        link_id: c.link.link_id(),
        epoch: restarted.epoch(),
        resumed: false
    }));
    assert!(c.link.link_id() != old || c.link.epoch() == restarted.epoch());
    // Messaging starts at once, numbering from zero.
    assert_eq!(c.link.send(0, &[b"new"]), Ok(0));
    drive(&mut c, &mut l, |_, l| !l.messages().is_empty());
    assert_eq!(l.messages(), [(0, 0, vec![b"new".to_vec()])]);
}

#[test]
fn messages_sent_before_the_first_handshake_go_out() {
    let (mut cs, mut ls) = socket_pair();
    let mut instance = Listener::new([ENDPOINT], Params::default());
    let mut link = Link::connect(connector_config(Params::default(), Limits::default())).unwrap();
    link.send(4, &[b"early"]).unwrap();
    let accepted = handshake(&mut link, &mut cs, &mut ls, &mut instance).unwrap();
    let mut l = Peer {
        link: Link::accept(accepted, Limits::default()).unwrap(),
        stream: ls,
        events: Vec::new(),
    };
    let mut c = Peer { link, stream: cs, events: Vec::new() };
    drive(&mut c, &mut l, |_, l| !l.messages().is_empty());
    assert_eq!(l.messages(), [(4, 0, vec![b"early".to_vec()])]);
}

// ---- shutdown ----

#[test]
fn shutdown_from_both_sides_ends_the_link() {
    let (mut c, mut l, _instance) = default_pair();
    c.link.send(0, &[b"last"]).unwrap();
    c.link.shutdown();
    // After shutdown nothing more is sent: no channel opens (relink 3.6),
    // and an open one takes nothing either (the reference implementation
    // drops the connection on a message after a shutdown).
    assert_eq!(c.link.send(1, &[b"x"]), Err(CommandError::ShutDown));
    assert_eq!(c.link.send(0, &[b"too late"]), Err(CommandError::ShutDown));
    drive(&mut c, &mut l, |_, l| l.events.contains(&Event::PeerShutdown));
    assert!(!c.link.is_done() && !l.link.is_done());
    assert_eq!(l.messages(), [(0, 0, vec![b"last".to_vec()])], "what was sent before goes");
    l.link.shutdown();
    drive(&mut c, &mut l, |c, l| c.link.is_done() && l.link.is_done());
    assert!(c.events.contains(&Event::Done) && l.events.contains(&Event::Done));
    assert_eq!(c.link.send(0, &[b"x"]), Err(CommandError::LinkDone));
    assert_eq!(c.link.reconnect(false), Err(CommandError::LinkDone));
}

// ---- violations ----

/// An open link fed raw bytes as if from its peer.
fn open_listener_link(params: Params) -> Link {
    open_listener_link_with(params, Limits::default())
}

fn open_listener_link_with(params: Params, limits: Limits) -> Link {
    let mut instance = Listener::new([ENDPOINT], params);
    let mut acceptor = Acceptor::new();
    let mut request = vec![0; 8];
    let repr = relink::RequestRepr {
        name: ENDPOINT,
        connector_id_len: params.connector_id_len,
        listener_id_len: params.listener_id_len,
        flags: {
            let mut flags = relink::HandshakeFlags::empty();
            flags
                .set(relink::HandshakeFlags::CONNECTOR_TRANSACTIONS, params.connector_transactions);
            flags.set(relink::HandshakeFlags::LISTENER_TRANSACTIONS, params.listener_transactions);
            flags
        },
        epoch: 0,
        link_id: 0,
    };
    let at = request.len();
    request.resize(at + repr.buffer_len(), 0);
    repr.emit(&mut request[at..]).unwrap();
    let accepted = acceptor.handle_input(&request, &mut instance).unwrap().unwrap();
    Link::accept(accepted, limits).unwrap()
}

#[test]
fn protocol_violations_terminate_the_stream() {
    let params = Params { connector_id_len: 1, listener_id_len: 1, ..Params::default() };
    // Unknown general packet type.
    let mut link = open_listener_link(params);
    assert_eq!(
        link.handle_input(&[7 << 5, 0, 0, 0, 0, 0, 0, 0]),
        Err(LinkError::Wire(WireError::UnknownGeneralType(7)))
    );
    // Acknowledging a message never sent (received ack, channel 3).
    let mut link = open_listener_link(params);
    assert_eq!(
        link.handle_input(&[0x05, 0, 3, 0, 0, 0, 0, 0]),
        Err(LinkError::AckBeyondSent { channel: ch(3), seq: 0 })
    );
    // A commit without negotiated transactions.
    let mut link = open_listener_link(params);
    assert_eq!(
        link.handle_input(&[0x01, 0, 3, 0, 0, 0, 0, 0]),
        Err(LinkError::TransactionsNotNegotiated { channel: ch(3) })
    );
    // A message on channel 3 after its close, before the closure was
    // confirmed (relink 3.3: reopening follows the confirmation).
    let mut link = open_listener_link(params);
    let (message, close) = (raw_message(3, b'x'), raw_close(3));
    assert_eq!(
        link.handle_input(&[&message[..], &close, &message].concat()),
        Err(LinkError::MessageWhileClosing { channel: ch(3) })
    );
    // A resume packet on a new link.
    let mut link = open_listener_link(params);
    assert_eq!(link.handle_input(&[3 << 5, 0, 0, 0, 0, 0, 0, 0]), Err(LinkError::UnexpectedResume));
    // After a violation the stream is dead until the link gets a new one.
    assert_eq!(link.handle_input(&[0; 8]), Err(LinkError::NoStream));
}

#[test]
fn window_overrun_terminates() {
    // A message on channel 0 (4-byte id) with no parts: 8 bytes.
    let message = [0x11, 0, 0, 0, 0, 0, 0, 0];
    let limits = Limits { recv_window: 16, ..Limits::default() };
    let mut link = open_listener_link_with(Params::default(), limits);
    assert_eq!(link.handle_input(&message.repeat(16)), Ok(()));
    // Consumed but not yet acknowledged: the peer cannot know, so its
    // window has not moved.
    link.consume(0, 7).unwrap();
    assert_eq!(
        link.handle_input(&message),
        Err(LinkError::WindowExceeded { channel: ch(0), max: 16 })
    );

    // Once the consumption is written, the peer may go on by as much.
    let mut link = open_listener_link_with(Params::default(), limits);
    assert_eq!(link.handle_input(&message.repeat(16)), Ok(()));
    link.consume(0, 7).unwrap();
    link.poll_transmit(&mut Vec::new());
    assert_eq!(link.handle_input(&message.repeat(8)), Ok(()));
    assert_eq!(
        link.handle_input(&message),
        Err(LinkError::WindowExceeded { channel: ch(0), max: 16 })
    );
}

#[test]
fn a_burst_within_the_reference_window_does_not_end_the_link() {
    // What the reference implementation sends with its default window of
    // 65,536 before anything is consumed: 10,000 messages on channel 1,
    // each one 1-byte part ("x").
    let message = [0x11, 1, 1, 0, 0, 0, 1, 0, b'x', 0, 0, 0, 0, 0, 0, 0];
    let mut link = open_listener_link(Params::default());
    assert_eq!(link.handle_input(&message.repeat(BURST as usize)), Ok(()));
    let mut seqs = Vec::new();
    while let Some(event) = link.poll_event() {
        if let Event::Message { channel, seq, parts } = event {
            assert_eq!((channel, parts), (ch(1), vec![b"x".to_vec()]));
            seqs.push(seq);
        }
    }
    assert_eq!(seqs, (0..BURST).collect::<Vec<_>>());
}

#[test]
fn mutated_streams_never_panic_the_link() {
    let mut state = 0x0dd_c0ffee_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    // A valid stream: messages, acks, ops, pings on 1-byte channels.
    let seed: Vec<u8> =
        [
            &[
                0x11, 2, 1, 0, 3, 0, 1, 0, b'a', b'b', b'c', 0, 0, 0, 0, 0, b'z', 0, 0, 0, 0, 0, 0,
                0,
            ][..],
            &[0x20, 0, 0, 0, 0, 0, 0, 0],
            &[0x41, 0, 1, 0, 0, 0, 0, 0],
            &[0x0d, 0, 1, 0, 0, 0, 0, 0],
            &[0x13, 0, 0, 0, 2, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0],
        ]
        .concat();
    let params = Params {
        connector_id_len: 1,
        listener_id_len: 1,
        connector_transactions: true,
        listener_transactions: true,
    };
    for _ in 0..20_000 {
        let mut link = open_listener_link(params);
        let _ = link.send(1, &[b"x"]);
        let mut bytes = seed.clone();
        for _ in 0..1 + next() % 6 {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
        }
        // Feed in random chunks, as a stream would.
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let n = 1 + (next() % rest.len() as u64) as usize;
            if link.handle_input(&rest[..n]).is_err() {
                break;
            }
            rest = &rest[n..];
            let mut out = Vec::new();
            link.poll_transmit(&mut out);
            while link.poll_event().is_some() {}
        }
    }
}

// ---- the blocking TCP driver ----

fn options() -> Options {
    Options { timeout: Duration::from_secs(2), ..Options::default() }
}

#[test]
fn tcp_apps_exchange_setup_data() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let server = thread::spawn(move || {
        let mut conn = relink::accept(&tcp, &["pingpong", ENDPOINT], &options()).unwrap();
        // One channel per lcore: collect each lcore's address.
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(conn.recv(Duration::from_secs(2)).unwrap());
        }
        conn.send(0, &[b"server-addr", &[1, 2, 3]]).unwrap();
        conn.ping(Duration::from_secs(2)).unwrap();
        conn.shutdown().unwrap();
        got
    });
    let mut conn = relink::connect(addr, ENDPOINT, &options()).unwrap();
    for lcore in 0..3u64 {
        conn.send(lcore, &[b"addr", &lcore.to_le_bytes()]).unwrap();
    }
    let (channel, parts) = conn.recv(Duration::from_secs(2)).unwrap();
    assert_eq!(channel, 0);
    assert_eq!(parts, [b"server-addr".to_vec(), vec![1, 2, 3]]);
    let rtt = conn.ping(Duration::from_secs(2)).unwrap();
    assert!(rtt < Duration::from_secs(1));
    conn.shutdown().unwrap();
    assert!(conn.link().is_done());
    assert!(matches!(conn.recv(Duration::from_millis(1)), Err(TcpError::ShutDown)));
    let got = server.join().unwrap();
    for (lcore, (channel, parts)) in got.into_iter().enumerate() {
        assert_eq!(channel, lcore as u64);
        assert_eq!(parts, [b"addr".to_vec(), (lcore as u64).to_le_bytes().to_vec()]);
    }
}

#[test]
fn tcp_recv_times_out() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let server = thread::spawn(move || {
        let mut conn = relink::accept(&tcp, &[ENDPOINT], &options()).unwrap();
        conn.shutdown().unwrap();
    });
    let mut conn = relink::connect(addr, ENDPOINT, &options()).unwrap();
    let start = Instant::now();
    assert!(matches!(conn.recv(Duration::from_millis(30)), Err(TcpError::Timeout)));
    assert!(start.elapsed() < Duration::from_millis(500));
    conn.shutdown().unwrap();
    server.join().unwrap();
}

#[test]
fn tcp_unknown_endpoint_is_refused() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let server = thread::spawn(move || relink::accept(&tcp, &["pingpong"], &options()));
    let result = relink::connect(addr, "streaming", &options());
    assert!(matches!(result, Err(TcpError::Disconnected)), "{result:?}");
    assert!(matches!(
        server.join().unwrap(),
        Err(TcpError::Handshake(HandshakeError::UnknownEndpoint(name))) if name == "streaming"
    ));
}

#[test]
fn tcp_reconnect_resumes_the_link() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let server = thread::spawn(move || {
        let mut server = relink::Server::new(tcp, &[ENDPOINT], options());
        let Incoming::New(mut conn) = server.accept().unwrap() else {
            panic!("expected a new link");
        };
        let mut got = vec![conn.recv(Duration::from_secs(2)).unwrap()];
        // Break the stream; the connector comes back and resumes.
        conn.disconnect();
        let Incoming::Resume(resumption) = server.accept().unwrap() else {
            panic!("expected a resumption");
        };
        assert_eq!(resumption.link_id(), conn.link_id());
        conn.resume(resumption).unwrap();
        while got.len() < 4 {
            got.push(conn.recv(Duration::from_secs(2)).unwrap());
        }
        conn.shutdown().unwrap();
        server.forget(conn.link_id());
        got
    });
    let mut conn = relink::connect(addr, ENDPOINT, &options()).unwrap();
    conn.send(0, &[b"one"]).unwrap();
    // Wait until the server drops the stream.
    let err = conn.recv(Duration::from_secs(2)).unwrap_err();
    assert!(matches!(err, TcpError::Disconnected | TcpError::Io(_)), "{err:?}");
    conn.send(0, &[b"two"]).unwrap_or_default();
    assert!(conn.reconnect().unwrap());
    conn.send(0, &[b"three"]).unwrap();
    conn.send(1, &[b"four"]).unwrap();
    conn.shutdown().unwrap();
    let got = server.join().unwrap();
    let payloads: Vec<_> = got.iter().map(|(c, p)| (c.to_u64().unwrap(), p[0].clone())).collect();
    assert_eq!(
        payloads,
        [(0, b"one".to_vec()), (0, b"two".to_vec()), (0, b"three".to_vec()), (1, b"four".to_vec()),]
    );
}

#[test]
fn tcp_takes_a_huge_timeout_as_a_far_deadline() {
    // `Instant::now() + Duration::MAX` overflows; every wait saturates.
    let huge = Options { timeout: Duration::MAX, ..Options::default() };
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let server_options = huge.clone();
    let server = thread::spawn(move || {
        let mut conn = relink::accept(&tcp, &[ENDPOINT], &server_options).unwrap();
        let got = conn.recv(Duration::MAX).unwrap();
        conn.send(0, &[b"back"]).unwrap();
        conn.ping(Duration::MAX).unwrap();
        conn.shutdown().unwrap();
        got
    });
    let mut conn = relink::connect(addr, ENDPOINT, &huge).unwrap();
    conn.send(0, &[b"there"]).unwrap();
    assert_eq!(conn.recv(Duration::MAX).unwrap(), (ch(0), vec![b"back".to_vec()]));
    conn.shutdown().unwrap();
    assert_eq!(server.join().unwrap(), (ch(0), vec![b"there".to_vec()]));
    assert!(relink::deadline_after(Duration::MAX) > Instant::now() + DEADLINE);
}

#[test]
fn tcp_a_stalled_handshake_ends_at_its_own_bound() {
    // A caller that accepts the stream itself bounds its handshake alone.
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let _silent = TcpStream::connect(addr).unwrap();
    let (stream, _) = tcp.accept().unwrap();
    let short = Options { timeout: Duration::from_millis(100), ..Options::default() };
    let result = relink::accept_stream(stream, &[ENDPOINT], &short);
    assert!(matches!(result, Err(TcpError::Timeout)), "{result:?}");
}

/// A connected pair of Conns: the connector, the listener, and a second
/// handle on the listener's socket to break it with.
fn conn_pair() -> (relink::Conn, relink::Conn, TcpStream) {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let dialer = thread::spawn(move || relink::connect(addr, ENDPOINT, &options()).unwrap());
    let (stream, _) = tcp.accept().unwrap();
    let raw = stream.try_clone().unwrap();
    let listener = relink::accept_stream(stream, &[ENDPOINT], &options()).unwrap();
    (dialer.join().unwrap(), listener, raw)
}

#[test]
fn tcp_after_a_write_error_nothing_of_the_dead_stream_is_read() {
    for _ in 0..20 {
        let (mut c, mut l, raw) = conn_pair();
        // Every write on the listener's stream fails from now on, while
        // what the connector sends still arrives in its socket.
        raw.shutdown(Shutdown::Write).unwrap();
        // The message is queued for a resumption: not an error.
        assert_eq!(l.send(0, &[b"queued"]).unwrap(), 0);
        c.send(0, &[b"late"]).unwrap();
        // The stream is lost: "late" is not read from it, neither now nor
        // on a later call.
        for _ in 0..2 {
            let result = l.recv(DEADLINE);
            assert!(matches!(result, Err(TcpError::Disconnected)), "{result:?}");
        }
        let result = l.ping(DEADLINE);
        assert!(matches!(result, Err(TcpError::Disconnected)), "{result:?}");
        assert_eq!(l.link().unacknowledged(), 1);
    }
}

#[test]
fn tcp_a_message_queued_when_a_write_fails_goes_after_the_resumption() {
    for _ in 0..10 {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut server = relink::Server::new(tcp.try_clone().unwrap(), &[ENDPOINT], options());
        let dialer = thread::spawn(move || relink::connect(addr, ENDPOINT, &options()).unwrap());
        let (stream, _) = tcp.accept().unwrap();
        let raw = stream.try_clone().unwrap();
        let Incoming::New(mut l) = server.accept_stream(stream).unwrap() else {
            panic!("expected a new link");
        };
        let mut c = dialer.join().unwrap();
        raw.shutdown(Shutdown::Write).unwrap();
        assert_eq!(l.send(0, &[b"queued"]).unwrap(), 0);
        c.send(0, &[b"late"]).unwrap();
        assert!(matches!(l.recv(DEADLINE), Err(TcpError::Disconnected)));

        // The connector sees the end of the stream, dials again and
        // resumes: each message arrives once.
        let dialer = thread::spawn(move || {
            let result = c.recv(DEADLINE);
            assert!(matches!(result, Err(TcpError::Disconnected)), "{result:?}");
            assert!(c.reconnect().unwrap());
            let got = c.recv(DEADLINE).unwrap();
            c.shutdown().unwrap();
            got
        });
        let (stream, _) = tcp.accept().unwrap();
        let Incoming::Resume(resumption) = server.accept_stream(stream).unwrap() else {
            panic!("expected a resumption");
        };
        l.resume(resumption).unwrap();
        assert_eq!(l.recv(DEADLINE).unwrap(), (ch(0), vec![b"late".to_vec()]));
        l.shutdown().unwrap();
        assert_eq!(dialer.join().unwrap(), (ch(0), vec![b"queued".to_vec()]));
        assert!(matches!(l.recv(Duration::ZERO), Err(TcpError::ShutDown)));
    }
}

#[test]
fn tcp_conns_use_255_byte_channel_ids() {
    let params = Params { connector_id_len: 255, listener_id_len: 255, ..Params::default() };
    let options = Options { params, ..options() };
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let wide = widest_id(255);
    let server_options = options.clone();
    let server = thread::spawn(move || {
        let mut conn = relink::accept(&tcp, &[ENDPOINT], &server_options).unwrap();
        let got = conn.recv(DEADLINE).unwrap();
        conn.send(&got.0, &[b"back"]).unwrap();
        conn.shutdown().unwrap();
        got
    });
    let mut conn = relink::connect(addr, ENDPOINT, &options).unwrap();
    conn.send(&wide, &[b"there"]).unwrap();
    assert_eq!(conn.recv(DEADLINE).unwrap(), (wide.clone(), vec![b"back".to_vec()]));
    conn.shutdown().unwrap();
    assert_eq!(server.join().unwrap(), (wide, vec![b"there".to_vec()]));
}

// ---- the Conn's API: closure, multicast, transactions, consumption ----

/// The next event that is not the handshake's.
fn next_event(conn: &mut relink::Conn) -> Event {
    loop {
        match conn.next_event(DEADLINE).unwrap() {
            Event::Connected { .. } => {}
            event => return event,
        }
    }
}

fn message(channel: u64, seq: u32, part: &[u8]) -> Event {
    Event::Message { channel: ch(channel), seq, parts: vec![part.to_vec()] }
}

#[test]
fn tcp_a_closed_channel_ends_after_its_messages_and_reopens_from_zero() {
    let (mut a, mut b) = relink::loopback_pair(ENDPOINT, &options()).unwrap();
    assert_eq!(a.send(5, &[b"one"]).unwrap(), 0);
    assert_eq!(a.send(5, &[b"two"]).unwrap(), 1);
    a.close(5).unwrap();
    let closing = a.send(5, &[b"late"]);
    assert!(
        matches!(closing, Err(TcpError::Command(CommandError::ChannelClosing { .. }))),
        "{closing:?}"
    );
    // The peer sees the closure after the channel's messages.
    assert_eq!(next_event(&mut b), message(5, 0, b"one"));
    assert_eq!(next_event(&mut b), message(5, 1, b"two"));
    assert_eq!(next_event(&mut b), Event::PeerClosed { channel: ch(5) });
    // Not confirmed while a message of it is unconsumed.
    let early = a.wait_closed(5, Duration::from_millis(100));
    assert!(matches!(early, Err(TcpError::Timeout)), "{early:?}");
    assert!(a.link().is_closing(5));
    b.consume(5, 1).unwrap();
    a.wait_closed(5, DEADLINE).unwrap();
    assert!(a.link().is_closed(5));
    // The confirmation was taken by the wait, not left for poll_event.
    assert!(!std::iter::from_fn(|| a.poll_event()).any(|e| matches!(e, Event::Closed { .. })));
    // Sending reopens the channel, numbered from 0.
    assert_eq!(a.send(5, &[b"again"]).unwrap(), 0);
    assert_eq!(next_event(&mut b), message(5, 0, b"again"));
    let never = a.wait_closed(6, DEADLINE);
    assert!(
        matches!(never, Err(TcpError::Command(CommandError::ChannelNotOpen { .. }))),
        "{never:?}"
    );
}

#[test]
fn tcp_multicast_numbers_each_channel_and_waits_for_every_window() {
    let limits = Limits { send_window: 2, ..Limits::default() };
    let (mut a, mut b) = relink::loopback_pair(ENDPOINT, &Options { limits, ..options() }).unwrap();
    assert_eq!(a.send(1, &[b"x"]).unwrap(), 0);
    assert_eq!(a.send_multicast(&[1u64, 2, 2], &[b"all"]).unwrap(), [1, 0, 1]);
    assert_eq!(next_event(&mut b), message(1, 0, b"x"));
    assert_eq!(next_event(&mut b), message(1, 1, b"all"));
    assert_eq!(next_event(&mut b), message(2, 0, b"all"));
    assert_eq!(next_event(&mut b), message(2, 1, b"all"));
    // Each channel is acknowledged on its own.
    b.consume(2, 1).unwrap();
    a.wait_consumed(2, 1, DEADLINE).unwrap();
    assert!(!a.link().is_consumed(1, 0).unwrap());
    // More copies for one channel than its window is refused at once.
    let start = Instant::now();
    let beyond = a.send_multicast(&[3u64, 3, 3], &[b"x"]);
    assert!(
        matches!(
            beyond,
            Err(TcpError::Command(CommandError::BeyondWindow { count: 3, window: 2, .. }))
        ),
        "{beyond:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(1));

    // Channel 1's window is full: the multicast waits for it, and channel
    // 4 gets nothing meanwhile.
    let consumer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        b.consume(1, 1).unwrap();
        let mut rest = Vec::new();
        while rest.len() < 2 {
            rest.push(next_event(&mut b));
        }
        rest
    });
    let start = Instant::now();
    assert_eq!(a.send_multicast(&[4u64, 1], &[b"later"]).unwrap(), [0, 2]);
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert_eq!(consumer.join().unwrap(), [message(4, 0, b"later"), message(1, 2, b"later")]);
}

#[test]
fn tcp_commit_and_rollback_reach_the_receiver_in_order_with_outcomes() {
    let params = Params { connector_transactions: true, ..Params::default() };
    let (mut a, mut b) = relink::loopback_pair(ENDPOINT, &Options { params, ..options() }).unwrap();
    a.send(0, &[b"t1"]).unwrap();
    a.send(0, &[b"t2"]).unwrap();
    assert_eq!(a.commit(0).unwrap(), 1);
    a.send(0, &[b"t3"]).unwrap();
    assert_eq!(a.rollback(0).unwrap(), 2);
    a.send(0, &[b"t4"]).unwrap();
    assert_eq!(a.commit(0).unwrap(), 3);
    let nothing = a.commit(0);
    assert!(
        matches!(nothing, Err(TcpError::Command(CommandError::NothingToCommit { .. }))),
        "{nothing:?}"
    );
    // The listener's channels do not use transactions.
    let refused = b.commit(0);
    assert!(
        matches!(refused, Err(TcpError::Command(CommandError::TransactionsNotNegotiated))),
        "{refused:?}"
    );

    let events: Vec<_> = (0..7).map(|_| next_event(&mut b)).collect();
    assert_eq!(
        events,
        [
            message(0, 0, b"t1"),
            message(0, 1, b"t2"),
            Event::Commit { channel: ch(0), seq: 1 },
            message(0, 2, b"t3"),
            Event::Rollback { channel: ch(0), seq: 2 },
            message(0, 3, b"t4"),
            Event::Commit { channel: ch(0), seq: 3 },
        ]
    );
    // Outcomes in commit order; the sender waits for each by number.
    let early = b.resolve_commit(0, 3, false);
    assert!(
        matches!(early, Err(TcpError::Command(CommandError::NoPendingCommit { seq: 3, .. }))),
        "{early:?}"
    );
    b.consume(0, 3).unwrap();
    b.resolve_commit(0, 1, true).unwrap();
    b.resolve_commit(0, 3, false).unwrap();
    assert!(!a.wait_commit(0, 3, DEADLINE).unwrap());
    assert!(a.wait_commit(0, 1, DEADLINE).unwrap());
    // Each outcome is taken once.
    let again = a.wait_commit(0, 1, DEADLINE);
    assert!(
        matches!(again, Err(TcpError::Command(CommandError::NoPendingCommit { seq: 1, .. }))),
        "{again:?}"
    );
    assert!(a.link().is_consumed(0, 3).unwrap());
}

#[test]
fn tcp_a_message_counts_consumed_only_once_the_receiver_says_so() {
    let (mut a, mut b) = relink::loopback_pair(ENDPOINT, &options()).unwrap();
    let window = Limits::default().send_window;
    assert_eq!(a.send(0, &[b"m0"]).unwrap(), 0);
    assert_eq!(a.send(0, &[b"m1"]).unwrap(), 1);
    let m0 = b.recv_unconsumed(DEADLINE).unwrap();
    let m1 = b.recv_unconsumed(DEADLINE).unwrap();
    assert_eq!((m0.seq, m0.parts), (0, vec![b"m0".to_vec()]));
    assert_eq!((m1.channel, m1.seq), (ch(0), 1));
    // Received, not consumed: the sender still counts both.
    let early = a.wait_consumed(0, 0, Duration::from_millis(100));
    assert!(matches!(early, Err(TcpError::Timeout)), "{early:?}");
    assert_eq!(a.link().send_window(0), window - 2);
    b.consume(0, 0).unwrap();
    a.wait_consumed(0, 0, DEADLINE).unwrap();
    assert!(!a.link().is_consumed(0, 1).unwrap());
    assert_eq!(a.link().send_window(0), window - 1);
    b.consume(0, 1).unwrap();
    a.wait_consumed(0, 1, DEADLINE).unwrap();
    assert_eq!(a.link().send_window(0), window);
    // Consumption is acknowledged once, and only of messages sent.
    let twice = b.consume(0, 1);
    assert!(
        matches!(twice, Err(TcpError::Command(CommandError::NoSuchMessage { seq: 1, .. }))),
        "{twice:?}"
    );
    let unsent = a.wait_consumed(0, 5, DEADLINE);
    assert!(
        matches!(unsent, Err(TcpError::Command(CommandError::NotSent { seq: 5, .. }))),
        "{unsent:?}"
    );
    // recv consumes the message it returns, and every earlier one.
    a.send(0, &[b"m2"]).unwrap();
    a.send(0, &[b"m3"]).unwrap();
    b.recv_unconsumed(DEADLINE).unwrap();
    assert_eq!(b.recv(DEADLINE).unwrap(), (ch(0), vec![b"m3".to_vec()]));
    a.wait_consumed(0, 3, DEADLINE).unwrap();
}

// ---- the Conn's API: reconnection ----

#[test]
fn tcp_reconnect_resumes_only_the_old_link_or_starts_a_fresh_one() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let server = thread::spawn(move || {
        let mut server = relink::Server::new(tcp, &[ENDPOINT], options());
        let Incoming::New(mut first) = server.accept().unwrap() else {
            panic!("expected a new link");
        };
        let mut got = vec![first.recv(DEADLINE).unwrap()];
        let Incoming::Resume(resumption) = server.accept().unwrap() else {
            panic!("expected a resumption");
        };
        first.resume(resumption).unwrap();
        got.push(first.recv(DEADLINE).unwrap());
        // The link is over for this side: resuming it is refused.
        server.forget(first.link_id());
        let refused = server.accept();
        assert!(
            matches!(
                refused,
                Err(TcpError::Handshake(HandshakeError::LinkLost(id))) if id == first.link_id()
            ),
            "{refused:?}"
        );
        let Incoming::New(mut second) = server.accept().unwrap() else {
            panic!("expected a new link");
        };
        got.push(second.recv(DEADLINE).unwrap());
        second.shutdown().unwrap();
        (got, first.link_id(), second.link_id())
    });
    let mut conn = relink::connect(addr, ENDPOINT, &options()).unwrap();
    let old = conn.link_id();
    let seq = conn.send(0, &[b"one"]).unwrap();
    conn.wait_consumed(0, seq, DEADLINE).unwrap();

    // Resume only: the listener knows the link, and the message queued
    // while the stream was down goes on it.
    conn.disconnect();
    let seq = conn.send(0, &[b"two"]).unwrap();
    assert!(conn.reconnect_with(Reconnect::ResumeOnly).unwrap());
    assert_eq!(conn.link_id(), old);
    conn.wait_consumed(0, seq, DEADLINE).unwrap();

    // Resume only, the listener has forgotten the link: no new one.
    conn.disconnect();
    let lost = conn.reconnect_with(Reconnect::ResumeOnly);
    assert!(
        matches!(lost, Err(TcpError::Handshake(HandshakeError::LinkLost(id))) if id == old),
        "{lost:?}"
    );
    // Fresh: what the old link still held is discarded at once, and the
    // new link numbers from 0.
    conn.send(0, &[b"discarded"]).unwrap();
    assert!(!conn.reconnect_with(Reconnect::Fresh).unwrap());
    assert_ne!(conn.link_id(), old);
    assert_eq!(conn.link().unacknowledged(), 0);
    assert_eq!(conn.send(0, &[b"three"]).unwrap(), 0);
    conn.shutdown().unwrap();
    // The refused attempt opened no stream.
    assert_eq!(conn.reconnects(), 2);

    let (got, first, second) = server.join().unwrap();
    assert_eq!((first, second), (old, conn.link_id()));
    let payloads: Vec<_> = got.into_iter().map(|(_, parts)| parts[0].clone()).collect();
    assert_eq!(payloads, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
}

fn auto_reconnect(attempts: u32) -> AutoReconnect {
    AutoReconnect {
        attempts,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(40),
        mode: Reconnect::Resume,
    }
}

#[test]
fn tcp_auto_reconnect_comes_back_by_itself_and_delivers_queued_messages_once() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let server = thread::spawn(move || {
        let mut server = relink::Server::new(tcp.try_clone().unwrap(), &[ENDPOINT], options());
        let (stream, _) = tcp.accept().unwrap();
        let raw = stream.try_clone().unwrap();
        let Incoming::New(mut conn) = server.accept_stream(stream).unwrap() else {
            panic!("expected a new link");
        };
        let mut got = vec![conn.recv(DEADLINE).unwrap()];
        // Kill the connection under both Conns.
        raw.shutdown(Shutdown::Both).unwrap();
        // Queued: the stream is dead.
        conn.send(0, &[b"s0"]).unwrap();
        conn.send(0, &[b"s1"]).unwrap();
        // The connector comes back on its own.
        let (stream, _) = tcp.accept().unwrap();
        let Incoming::Resume(resumption) = server.accept_stream(stream).unwrap() else {
            panic!("expected a resumption");
        };
        conn.resume(resumption).unwrap();
        while got.len() < 4 {
            got.push(conn.recv(DEADLINE).unwrap());
        }
        conn.wait_consumed(0, 1, DEADLINE).unwrap();
        conn.shutdown().unwrap();
        got
    });
    let auto = Options { auto_reconnect: Some(auto_reconnect(10)), ..options() };
    let mut conn = relink::connect(addr, ENDPOINT, &auto).unwrap();
    let old = conn.link_id();
    conn.send(0, &[b"c0"]).unwrap();
    conn.wait_consumed(0, 0, DEADLINE).unwrap();
    // Written to a stream that may be dead already: kept until acknowledged.
    conn.send(0, &[b"c1"]).unwrap();
    // The Conn meets the end of the stream here, dials again, resumes, and
    // reads what the listener queued meanwhile.
    assert_eq!(conn.recv(DEADLINE).unwrap(), (ch(0), vec![b"s0".to_vec()]));
    assert_eq!(conn.recv(DEADLINE).unwrap(), (ch(0), vec![b"s1".to_vec()]));
    assert_eq!(conn.reconnects(), 1);
    assert_eq!(conn.link_id(), old);
    let resumed: Vec<_> =
        std::iter::from_fn(|| conn.poll_event()).filter(|e| *e == Event::PeerResumed).collect();
    assert_eq!(resumed.len(), 1);
    conn.send(0, &[b"c2"]).unwrap();
    conn.send(0, &[b"c3"]).unwrap();
    conn.shutdown().unwrap();
    // Nothing more, in particular no second copy of s0 or s1.
    assert!(matches!(conn.recv(Duration::from_millis(50)), Err(TcpError::ShutDown)));
    let got: Vec<_> = server.join().unwrap().into_iter().map(|(_, p)| p[0].clone()).collect();
    assert_eq!(got, [b"c0".to_vec(), b"c1".to_vec(), b"c2".to_vec(), b"c3".to_vec()]);
}

#[test]
fn tcp_auto_reconnect_backs_off_and_gives_up_after_its_attempts() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let auto = Options { auto_reconnect: Some(auto_reconnect(3)), ..options() };
    let server_options = auto.clone();
    let server = thread::spawn(move || {
        let conn = relink::accept(&tcp, &[ENDPOINT], &server_options).unwrap();
        // Nothing listens any more: every attempt is refused.
        drop(tcp);
        drop(conn);
    });
    let mut conn = relink::connect(addr, ENDPOINT, &auto).unwrap();
    server.join().unwrap();
    let start = Instant::now();
    let result = conn.recv(DEADLINE);
    // Three attempts, with 20 and 40 ms between them.
    assert!(start.elapsed() >= Duration::from_millis(60), "{:?}", start.elapsed());
    assert!(start.elapsed() < DEADLINE);
    match result {
        Err(TcpError::ReconnectFailed { attempts: 3, last }) => {
            assert!(
                matches!(*last, TcpError::Io(ref e) if e.kind() == ErrorKind::ConnectionRefused)
            );
        }
        other => panic!("{other:?}"),
    }
    // It has given up: the next call does not try again.
    let start = Instant::now();
    assert!(matches!(conn.recv(DEADLINE), Err(TcpError::Disconnected)));
    assert!(start.elapsed() < Duration::from_millis(20));
}

// ---- the Conn's API: keepalive ----

fn keepalive(idle_ms: u64, pong_timeout_ms: u64) -> Option<Keepalive> {
    Some(Keepalive {
        idle: Duration::from_millis(idle_ms),
        pong_timeout: Duration::from_millis(pong_timeout_ms),
    })
}

#[test]
fn tcp_keepalive_fails_a_silent_peer_with_pong_timeout() {
    let watchful = Options { keepalive: keepalive(50, 100), ..options() };
    let (mut a, b) = relink::loopback_pair(ENDPOINT, &watchful).unwrap();
    // `b` is never called again, so it never answers.
    let start = Instant::now();
    let result = a.recv(Duration::from_secs(5));
    let waited = start.elapsed();
    assert!(
        matches!(
            result,
            Err(TcpError::PongTimeout { waited }) if waited == Duration::from_millis(100)
        ),
        "{result:?}"
    );
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    // The stream is given up; the link is kept for a reconnection.
    assert!(matches!(a.recv(DEADLINE), Err(TcpError::Disconnected)));
    assert!(!a.link().is_open());
    drop(b);
}

/// A connected pair of Conns, each with its own options.
fn pair_with(connector: Options, listener: Options) -> (relink::Conn, relink::Conn) {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let dialer = thread::spawn(move || relink::connect(addr, ENDPOINT, &connector).unwrap());
    let listener = relink::accept(&tcp, &[ENDPOINT], &listener).unwrap();
    (dialer.join().unwrap(), listener)
}

#[test]
fn tcp_keepalive_pings_a_live_but_quiet_peer() {
    let watchful = Options { keepalive: keepalive(20, 500), ..options() };
    let (mut a, mut b) = pair_with(watchful, options());
    // `b` answers pings while its recv drives it, until `a` speaks.
    let echo = thread::spawn(move || b.recv(Duration::from_secs(5)).unwrap());
    // Silent for 300 ms, but alive: the wait ends in a timeout, not a
    // pong timeout, and every 20 ms of silence cost a ping.
    let result = a.recv(Duration::from_millis(300));
    assert!(matches!(result, Err(TcpError::Timeout)), "{result:?}");
    assert!(a.pongs() >= 3, "{} pongs", a.pongs());
    a.send(0, &[b"done"]).unwrap();
    assert_eq!(echo.join().unwrap(), (ch(0), vec![b"done".to_vec()]));
}

// ---- the Conn's API: acknowledgement batching ----

#[test]
fn tcp_acks_wait_for_the_ack_window_or_the_ack_delay() {
    let batching = Options {
        limits: Limits { ack_window: 4, ..Limits::default() },
        ack_delay: Duration::from_millis(150),
        ..options()
    };
    let (mut a, mut b) = pair_with(options(), batching);
    for i in 0..3u8 {
        a.send(0, &[&[i]]).unwrap();
        b.recv(DEADLINE).unwrap();
    }
    // Three received and consumed, fewer than the window: both
    // acknowledgements are held.
    let held = a.wait_consumed(0, 2, Duration::from_millis(50));
    assert!(matches!(held, Err(TcpError::Timeout)), "{held:?}");
    assert_eq!(a.link().unacknowledged(), 3);
    // Driving `b` past the delay lets them go.
    while b.poll_event().is_some() {}
    let start = Instant::now();
    let idle = b.next_event(Duration::from_millis(300));
    assert!(matches!(idle, Err(TcpError::Timeout)), "{idle:?}");
    assert!(start.elapsed() >= Duration::from_millis(150));
    a.wait_consumed(0, 2, DEADLINE).unwrap();
    assert_eq!(a.link().unacknowledged(), 0);
    // The fourth message since the last acknowledgement fills the window:
    // acknowledged at once, without the delay.
    for i in 3..7u8 {
        a.send(0, &[&[i]]).unwrap();
        b.recv(DEADLINE).unwrap();
    }
    a.wait_consumed(0, 6, Duration::from_millis(100)).unwrap();
    // And release_acks sends a held one on request.
    a.send(0, &[b"x"]).unwrap();
    b.recv(DEADLINE).unwrap();
    let held = a.wait_consumed(0, 7, Duration::from_millis(50));
    assert!(matches!(held, Err(TcpError::Timeout)), "{held:?}");
    b.release_acks().unwrap();
    a.wait_consumed(0, 7, Duration::from_millis(100)).unwrap();
}

// ---- the Conn's API: a listener's options per endpoint name ----

#[test]
fn tcp_a_server_serves_each_name_with_its_own_options() {
    let wide_params = Params {
        connector_id_len: 8,
        listener_id_len: 8,
        connector_transactions: true,
        ..Params::default()
    };
    let wide_options = Options {
        params: wide_params,
        limits: Limits { send_window: 3, ..Limits::default() },
        ..options()
    };
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let mut server = relink::Server::new(tcp, &["plain"], options());
    server.serve(ENDPOINT, wide_options.clone());
    assert_eq!(server.options_for(ENDPOINT), &wide_options);
    assert_eq!(server.options_for("plain"), &options());

    let client_options = wide_options.clone();
    let clients = thread::spawn(move || {
        let mut plain = relink::connect(addr, "plain", &options()).unwrap();
        let mut wide = relink::connect(addr, ENDPOINT, &client_options).unwrap();
        // The name's own parameters: 8-byte ids and our transactions.
        let id = u64::MAX - 1;
        wide.send(id, &[b"wide"]).unwrap();
        let seq = wide.commit(id).unwrap();
        let outcome = wide.wait_commit(id, seq, DEADLINE).unwrap();
        plain.send(1, &[b"plain"]).unwrap();
        // Another name's parameters are refused by this one.
        let mismatch = relink::connect(addr, ENDPOINT, &options());
        let unknown = relink::connect(addr, "other", &options());
        plain.shutdown().unwrap();
        wide.shutdown().unwrap();
        (outcome, mismatch.err(), unknown.err())
    });
    let Incoming::New(mut plain) = server.accept().unwrap() else { panic!("a new link") };
    let Incoming::New(mut wide) = server.accept().unwrap() else { panic!("a new link") };
    assert_eq!(plain.link().endpoint_name(), "plain");
    assert_eq!(*plain.link().params(), Params::default());
    assert_eq!(wide.link().endpoint_name(), ENDPOINT);
    assert_eq!(*wide.link().params(), wide_params);
    // The name's limits, not the server's.
    assert_eq!(wide.link().limits().send_window, 3);
    assert_eq!(plain.link().limits().send_window, Limits::default().send_window);
    assert_eq!(
        next_event(&mut wide),
        Event::Message { channel: ch(u64::MAX - 1), seq: 0, parts: vec![b"wide".to_vec()] }
    );
    assert_eq!(next_event(&mut wide), Event::Commit { channel: ch(u64::MAX - 1), seq: 0 });
    wide.consume(u64::MAX - 1, 0).unwrap();
    wide.resolve_commit(u64::MAX - 1, 0, true).unwrap();
    assert_eq!(plain.recv(DEADLINE).unwrap(), (ch(1), vec![b"plain".to_vec()]));
    let mismatch = server.accept();
    assert!(
        matches!(
            mismatch,
            Err(TcpError::Handshake(HandshakeError::ParamsMismatch { ours, theirs }))
                if ours == wide_params && theirs == Params::default()
        ),
        "{mismatch:?}"
    );
    let unknown = server.accept();
    assert!(
        matches!(
            unknown,
            Err(TcpError::Handshake(HandshakeError::UnknownEndpoint(ref n))) if n == "other"
        ),
        "{unknown:?}"
    );
    plain.shutdown().unwrap();
    wide.shutdown().unwrap();
    let (outcome, mismatch, unknown) = clients.join().unwrap();
    assert!(outcome);
    assert!(matches!(mismatch, Some(TcpError::Disconnected)), "{mismatch:?}");
    assert!(matches!(unknown, Some(TcpError::Disconnected)), "{unknown:?}");
}
