#!/usr/bin/env python3
"""Regenerates vectors.txt from the golden captures in this directory.

Standard library only. For every capture it picks the first packet of each
(opcode, direction, pad, AckReq) kind, plus the explicitly listed extra frames
(retransmissions, duplicate ACKs). Each vector is the packet from the IPv4
header up to and including the ICRC (Ethernet header and any Ethernet padding
removed). The script re-verifies every ICRC it emits: CRC-32 (zlib) over
8 x 0xFF || IPv4+UDP+BTH... with TOS, TTL, IP checksum, UDP checksum and
BTH byte 4 replaced by 0xFF, compared with the 4 trailing bytes read as
little-endian.

Usage: python3 gen_vectors.py > vectors.txt   (run from this directory)
"""
import os
import struct
import sys
import zlib

CAPTURES = [
    'rc_pingpong_s64_n200.pcap',
    'rc_pingpong_s64_n5.pcap',
    'rc_pingpong_s4096_n3.pcap',
    'ud_pingpong_s64_n5.pcap',
    'ud_pingpong_s1024_n3.pcap',
    'ib_send_lat_n10.pcap',
    'ib_write_bw_s4096_n20.pcap',
    'ib_read_lat_n10.pcap',
    'ib_read_lat_s2500_n5.pcap',
    'ib_atomic_lat_n10.pcap',
]
# (capture, frame, note) kept in addition to the first-of-kind selection
EXTRA = [
    ('rc_pingpong_s64_n5.pcap', 18, 'requester retransmission (same PSN as frame 17, new IP ID)'),
    ('rc_pingpong_s64_n5.pcap', 22, 'responder ACK for a duplicate SEND: PSN = last PSN executed, MSN unchanged'),
]

NAMES = {0: 'SEND_FIRST', 1: 'SEND_MIDDLE', 2: 'SEND_LAST', 3: 'SEND_LAST_WITH_IMMEDIATE', 4: 'SEND_ONLY',
         5: 'SEND_ONLY_WITH_IMMEDIATE', 6: 'RDMA_WRITE_FIRST', 7: 'RDMA_WRITE_MIDDLE', 8: 'RDMA_WRITE_LAST',
         9: 'RDMA_WRITE_LAST_WITH_IMMEDIATE', 10: 'RDMA_WRITE_ONLY', 11: 'RDMA_WRITE_ONLY_WITH_IMMEDIATE',
         12: 'RDMA_READ_REQUEST', 13: 'RDMA_READ_RESPONSE_FIRST', 14: 'RDMA_READ_RESPONSE_MIDDLE',
         15: 'RDMA_READ_RESPONSE_LAST', 16: 'RDMA_READ_RESPONSE_ONLY', 17: 'ACKNOWLEDGE',
         18: 'ATOMIC_ACKNOWLEDGE', 19: 'COMPARE_SWAP', 20: 'FETCH_ADD'}
EXT = {3: ['IMM'], 5: ['IMM'], 6: ['RETH'], 9: ['IMM'], 10: ['RETH'], 11: ['RETH', 'IMM'], 12: ['RETH'],
       13: ['AETH'], 15: ['AETH'], 16: ['AETH'], 17: ['AETH'], 18: ['AETH', 'AtomicAckETH'],
       19: ['AtomicETH'], 20: ['AtomicETH']}
EXTLEN = {'IMM': 4, 'RETH': 16, 'AETH': 4, 'AtomicAckETH': 8, 'AtomicETH': 28, 'DETH': 8}


def read_pcap(path):
    data = open(path, 'rb').read()
    magic = struct.unpack('<I', data[:4])[0]
    e = {0xa1b2c3d4: '<', 0xd4c3b2a1: '>', 0xa1b23c4d: '<', 0x4d3cb2a1: '>'}[magic]
    linktype = struct.unpack(e + 'I', data[20:24])[0]
    assert linktype == 1, 'expected Ethernet captures'
    off, n = 24, 0
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(e + 'IIII', data[off:off + 16])
        off += 16
        n += 1
        yield n, data[off:off + incl]
        off += incl


def roce(frame):
    if struct.unpack('>H', frame[12:14])[0] != 0x0800:
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0xf) * 4
    if ip[9] != 17 or ihl != 20:
        return None
    sport, dport, ulen = struct.unpack('>HHH', ip[ihl:ihl + 6])
    if dport != 4791:
        return None
    return ip[:ihl + ulen]


def icrc_ok(ip):
    m = bytearray(ip[:-4])
    for i in (1, 8, 10, 11, 26, 27, 32):   # TOS, TTL, IP csum, UDP csum, BTH resv8a
        m[i] = 0xff
    return zlib.crc32(b'\xff' * 8 + bytes(m)) & 0xffffffff == struct.unpack('<I', ip[-4:])[0]


def describe(ip):
    b = ip[28:]
    op = b[0]
    cls = op >> 5
    pad = (b[1] >> 4) & 3
    ackreq = b[8] >> 7
    psn = struct.unpack('>I', b[8:12])[0] & 0xffffff
    if cls == 3:
        name, exts = 'UD_' + {4: 'SEND_ONLY', 5: 'SEND_ONLY_WITH_IMMEDIATE'}[op & 0x1f], ['DETH']
    else:
        name, exts = {0: 'RC_', 1: 'UC_'}[cls] + NAMES[op & 0x1f], EXT.get(op & 0x1f, [])
    hdr = 12 + sum(EXTLEN[h] for h in exts)
    paylen = len(b) - hdr - 4 - pad
    fields = ['psn=0x%06x' % psn, 'ackreq=%d' % ackreq, 'pad=%d' % pad, 'payload=%d' % paylen,
              'sport=%d' % struct.unpack('>H', ip[20:22])[0], 'ttl=%d' % ip[8]]
    off = 12
    for h in exts:
        x = b[off:off + EXTLEN[h]]
        if h == 'AETH':
            fields.append('aeth_syndrome=0x%02x msn=%d' % (x[0], struct.unpack('>I', x)[0] & 0xffffff))
        elif h == 'RETH':
            va, rkey, ln = struct.unpack('>QII', x)
            fields.append('reth_va=0x%x rkey=0x%x dmalen=%d' % (va, rkey, ln))
        elif h == 'DETH':
            fields.append('qkey=0x%08x srcqp=0x%06x' % (struct.unpack('>I', x[:4])[0],
                                                         struct.unpack('>I', x[4:])[0] & 0xffffff))
        elif h == 'AtomicETH':
            va, rkey, sa, cmp_ = struct.unpack('>QIQQ', x)
            fields.append('atomic_va=0x%x rkey=0x%x swap_add=0x%x compare=0x%x' % (va, rkey, sa, cmp_))
        elif h == 'AtomicAckETH':
            fields.append('orig=0x%x' % struct.unpack('>Q', x)[0])
        elif h == 'IMM':
            fields.append('imm=0x%08x' % struct.unpack('>I', x)[0])
        off += EXTLEN[h]
    return op, pad, ackreq, name, ' '.join(fields)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    extra = {(c, f): note for c, f, note in EXTRA}
    print('# RoCEv2 golden vectors extracted from the Soft-RoCE (rxe) captures in this directory.')
    print('# Regenerate with: python3 gen_vectors.py > vectors.txt')
    print('# One vector per line, 6 TAB-separated fields:')
    print('#   capture  frame  opcode(hex)  opcode-name  ip_len  description  hex')
    print('# hex = the packet from the first byte of the IPv4 header through the 4-byte ICRC')
    print('# (no Ethernet header, no Ethernet padding). ip_len = len(hex)/2 = IPv4 total length.')
    print('# Every ICRC below was verified: CRC-32 over 8x0xFF + masked IP/UDP/BTH + rest, stored LE.')
    for cap in CAPTURES:
        path = os.path.join(here, cap)
        seen = set()
        for n, frame in read_pcap(path):
            ip = roce(frame)
            if ip is None:
                continue
            op, pad, ackreq, name, desc = describe(ip)
            key = (op, ip[12:16], pad, ackreq)
            note = extra.get((cap, n))
            if key in seen and note is None:
                continue
            seen.add(key)
            if not icrc_ok(ip):
                sys.exit('bad ICRC in %s frame %d' % (cap, n))
            src = '.'.join(map(str, ip[12:16]))
            dst = '.'.join(map(str, ip[16:20]))
            d = '%s->%s %s' % (src, dst, desc)
            if note:
                d += ' [' + note + ']'
            print('\t'.join([cap, str(n), '0x%02x' % op, name, str(len(ip)), d, ip.hex()]))


if __name__ == '__main__':
    main()
