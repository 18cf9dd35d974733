package hl7

import "bytes"

// Escape returns s with the message delimiters, the escape character and
// CR/LF replaced by escape sequences (\F\ \S\ \R\ \T\ \E\ \X0D\ \X0A\, written
// with d.Escape), so that it can be placed in a field. If d has no escape
// character, s is returned unchanged.
func Escape(s string, d Delimiters) string {
	if !needsEscape([]byte(s), d) {
		return s
	}
	return string(AppendEscaped(make([]byte, 0, len(s)+16), []byte(s), d))
}

func needsEscape(s []byte, d Delimiters) bool {
	if d.Escape == 0 {
		return false
	}
	for _, c := range s {
		if c == '\r' || c == '\n' || (c != 0 && (c == d.Field || c == d.Component || c == d.Repetition || c == d.Escape || c == d.Subcomponent)) {
			return true
		}
	}
	return false
}

// AppendEscaped appends the escaped form of s (see [Escape]) to dst.
func AppendEscaped(dst, s []byte, d Delimiters) []byte {
	e := d.Escape
	if e == 0 {
		return append(dst, s...)
	}
	start := 0
	for i, c := range s {
		var code string
		switch {
		case c == 0:
			continue
		case c == d.Field:
			code = "F"
		case c == d.Component:
			code = "S"
		case c == d.Repetition:
			code = "R"
		case c == e:
			code = "E"
		case c == d.Subcomponent:
			code = "T"
		case c == '\r':
			code = "X0D"
		case c == '\n':
			code = "X0A"
		default:
			continue
		}
		dst = append(dst, s[start:i]...)
		dst = append(dst, e)
		dst = append(dst, code...)
		dst = append(dst, e)
		start = i + 1
	}
	return append(dst, s[start:]...)
}

// Unescape decodes the escape sequences in s:
//
//	\F\ \S\ \R\ \T\ \E\   field, component, repetition, subcomponent separator, escape character
//	\Xhhhh...\            the bytes given in hexadecimal
//	\H\ \N\               start/end highlighting: removed
//	\.br\                 line break: "\n"
//	\.sp n\               n line breaks (n defaults to 1)
//	\.sk n\               n spaces (n defaults to 1)
//	\.ce\                 centre the next line: "\n"
//	\.in n\ \.ti n\ \.fi\ \.nf\   indentation and fill mode: removed
//	\Cxxyy\ \Mxxyyzz\     character set switches: kept verbatim (no charset conversion)
//
// Unknown, malformed or unterminated sequences are kept verbatim.
// Unescape(Escape(s, d), d) == s for every s.
func Unescape(s string, d Delimiters) string {
	if d.Escape == 0 || bytes.IndexByte([]byte(s), d.Escape) < 0 {
		return s
	}
	return string(AppendUnescaped(make([]byte, 0, len(s)), []byte(s), d))
}

// AppendUnescaped appends the decoded form of s (see [Unescape]) to dst.
func AppendUnescaped(dst, s []byte, d Delimiters) []byte {
	e := d.Escape
	if e == 0 {
		return append(dst, s...)
	}
	for {
		i := bytes.IndexByte(s, e)
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		s = s[i:]
		j := bytes.IndexByte(s[1:], e)
		if j < 0 {
			return append(dst, s...) // unterminated: verbatim
		}
		var ok bool
		dst, ok = decodeEscape(dst, s[1:1+j], d)
		if !ok {
			dst = append(dst, s[:j+2]...)
		}
		s = s[j+2:]
	}
}

const maxRepeat = 64 // cap on \.sp n\ and \.sk n\

func decodeEscape(dst, seq []byte, d Delimiters) ([]byte, bool) {
	if len(seq) == 0 {
		return dst, false
	}
	if len(seq) == 1 {
		var c byte
		switch seq[0] {
		case 'F':
			c = d.Field
		case 'S':
			c = d.Component
		case 'R':
			c = d.Repetition
		case 'E':
			c = d.Escape
		case 'T':
			c = d.Subcomponent
		case 'H', 'N':
			return dst, true
		}
		if c == 0 {
			return dst, false
		}
		return append(dst, c), true
	}
	switch seq[0] {
	case 'X':
		h := seq[1:]
		if len(h)%2 != 0 {
			return dst, false
		}
		for _, c := range h {
			if unhex(c) < 0 {
				return dst, false
			}
		}
		for k := 0; k < len(h); k += 2 {
			dst = append(dst, byte(unhex(h[k])<<4|unhex(h[k+1])))
		}
		return dst, true
	case '.':
		if len(seq) < 3 {
			return dst, false
		}
		cmd, arg := string(seq[1:3]), seq[3:]
		n, ok := fmtArg(arg)
		if !ok {
			return dst, false
		}
		switch cmd {
		case "br":
			if len(arg) != 0 {
				return dst, false
			}
			return append(dst, '\n'), true
		case "ce":
			if len(arg) != 0 {
				return dst, false
			}
			return append(dst, '\n'), true
		case "fi", "nf":
			return dst, len(arg) == 0
		case "in", "ti":
			return dst, true
		case "sp", "sk":
			if n < 0 {
				n = 1
			}
			c := byte('\n')
			if cmd == "sk" {
				c = ' '
			}
			for k := 0; k < min(n, maxRepeat); k++ {
				dst = append(dst, c)
			}
			return dst, true
		}
	}
	return dst, false
}

// fmtArg parses the optional argument of a formatting command: spaces, an
// optional sign and digits. It returns -1 when there is no number.
func fmtArg(b []byte) (int, bool) {
	i := 0
	for i < len(b) && b[i] == ' ' {
		i++
	}
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		i++
	}
	if i == len(b) {
		return -1, i == 0 || b[i-1] == ' '
	}
	n := 0
	for ; i < len(b); i++ {
		if b[i] < '0' || b[i] > '9' {
			return 0, false
		}
		if n < 1<<20 {
			n = n*10 + int(b[i]-'0')
		}
	}
	return n, true
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
