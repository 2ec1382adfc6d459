"""crc32c.py — CRC-32C (Castagnoli, reflected 0x82F63B78), bit by bit: the checksum of checkpoint/crc32c.h,
written independently for the shell tests that edit a checkpoint and must checksum it again."""


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF
