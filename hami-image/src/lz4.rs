//! LZ4 block decompression (the fatbin's `--compress-mode=speed` entries: one raw LZ4 block,
//! no frame), into at most a given size.

/// Decompresses the LZ4 block `src` into at most `cap` bytes.
pub fn block(src: &[u8], cap: usize) -> Result<Vec<u8>, &'static str> {
    // LZ4 expands at most 255 times: a header claiming more costs nothing up front.
    let mut out: Vec<u8> = Vec::with_capacity(cap.min(src.len().saturating_mul(255)));
    let mut i = 0;
    let byte = |i: &mut usize| -> Result<u8, &'static str> {
        let b = *src.get(*i).ok_or("truncated sequence")?;
        *i += 1;
        Ok(b)
    };
    // An extended length: 255-bytes run until a smaller one.
    let more = |i: &mut usize, mut n: usize| -> Result<usize, &'static str> {
        loop {
            let b = byte(i)?;
            n = n.checked_add(usize::from(b)).ok_or("length overflow")?;
            if b != 255 {
                return Ok(n);
            }
        }
    };
    loop {
        let token = byte(&mut i)?;
        let mut lit = usize::from(token >> 4);
        if lit == 15 {
            lit = more(&mut i, lit)?;
        }
        let lits = i
            .checked_add(lit)
            .and_then(|e| src.get(i..e))
            .ok_or("literals past the end of the block")?;
        if out.len() + lit > cap {
            return Err("output larger than declared");
        }
        out.extend_from_slice(lits);
        i += lit;
        if i == src.len() {
            // The last sequence has literals only.
            return Ok(out);
        }
        let lo = byte(&mut i)?;
        let hi = byte(&mut i)?;
        let offset = usize::from(u16::from_le_bytes([lo, hi]));
        if offset == 0 || offset > out.len() {
            return Err("match offset out of range");
        }
        let mut len = usize::from(token & 15);
        if len == 15 {
            len = more(&mut i, len)?;
        }
        len += 4;
        if out.len() + len > cap {
            return Err("output larger than declared");
        }
        let start = out.len() - offset;
        for k in 0..len {
            // Overlapping copies repeat the pattern, byte by byte.
            let b = out[start + k];
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_overlapping_matches() {
        // "abc" then a match of offset 3, length 9 ("abcabcabc"), then literal "!".
        let src = [0x35, b'a', b'b', b'c', 3, 0, 0x10, b'!'];
        assert_eq!(block(&src, 64).unwrap(), b"abcabcabcabc!");
        assert_eq!(block(&src, 5), Err("output larger than declared"));
        // Offset 0, offset past the output, truncations.
        assert!(block(&[0x10, b'a', 0, 0], 64).is_err());
        assert!(block(&[0x10, b'a', 2, 0], 64).is_err());
        for n in 0..src.len() {
            let _ = block(&src[..n], 64);
        }
        assert!(block(&[], 64).is_err());
        // Extended lengths.
        let mut long = vec![0xf0, 0x00];
        long.extend(std::iter::repeat_n(b'x', 15));
        assert_eq!(block(&long, 15).unwrap().len(), 15);
    }
}
