package hl7

import "strconv"

// Path addresses an element, as in "PID-3[2].1" or "OBX(3)-5". Zero
// numbers mean "not given": Occurrence 0 is the first segment, Field 0 is
// the whole segment, Repetition 0 is the whole field (or the first repetition
// when a component is given), Component 0 the whole repetition and
// Subcomponent 0 the whole component.
type Path struct {
	Segment      string
	Occurrence   int
	Field        int
	Repetition   int
	Component    int
	Subcomponent int
}

// ParsePath parses a path (syntax in the package documentation).
func ParsePath(s string) (Path, error) {
	var p Path
	if len(s) < 3 || !isSegChar(s[0]) || !isSegChar(s[1]) || !isSegChar(s[2]) {
		return p, ErrBadPath
	}
	p.Segment = s[:3]
	i := 3
	var ok bool
	if i < len(s) && (s[i] == '(' || s[i] == '[') {
		if p.Occurrence, i, ok = bracketed(s, i); !ok {
			return Path{}, ErrBadPath
		}
	}
	if i == len(s) {
		return p, nil
	}
	if s[i] != '-' && s[i] != '.' {
		return Path{}, ErrBadPath
	}
	if p.Field, i, ok = number(s, i+1); !ok {
		return Path{}, ErrBadPath
	}
	if i < len(s) && (s[i] == '[' || s[i] == '(') {
		if p.Repetition, i, ok = bracketed(s, i); !ok {
			return Path{}, ErrBadPath
		}
	}
	if i < len(s) {
		if s[i] != '.' && s[i] != '-' {
			return Path{}, ErrBadPath
		}
		if p.Component, i, ok = number(s, i+1); !ok {
			return Path{}, ErrBadPath
		}
	}
	if i < len(s) {
		if s[i] != '.' && s[i] != '-' {
			return Path{}, ErrBadPath
		}
		if p.Subcomponent, i, ok = number(s, i+1); !ok {
			return Path{}, ErrBadPath
		}
	}
	if i != len(s) {
		return Path{}, ErrBadPath
	}
	return p, nil
}

// number parses a positive decimal number at s[i:].
func number(s string, i int) (int, int, bool) {
	n, j := 0, i
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		n = n*10 + int(s[j]-'0')
		if n > 1<<24 {
			return 0, j, false
		}
		j++
	}
	return n, j, j > i && n > 0
}

func bracketed(s string, i int) (int, int, bool) {
	closer := byte(')')
	if s[i] == '[' {
		closer = ']'
	}
	n, j, ok := number(s, i+1)
	if !ok || j >= len(s) || s[j] != closer {
		return 0, j, false
	}
	return n, j + 1, true
}

// String formats the path in the canonical syntax.
func (p Path) String() string {
	b := make([]byte, 0, 24)
	b = append(b, p.Segment...)
	if p.Occurrence > 1 {
		b = append(b, '(')
		b = strconv.AppendInt(b, int64(p.Occurrence), 10)
		b = append(b, ')')
	}
	if p.Field == 0 {
		return string(b)
	}
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(p.Field), 10)
	if p.Repetition > 0 {
		b = append(b, '[')
		b = strconv.AppendInt(b, int64(p.Repetition), 10)
		b = append(b, ']')
	}
	if p.Component > 0 {
		b = append(b, '.')
		b = strconv.AppendInt(b, int64(p.Component), 10)
		if p.Subcomponent > 0 {
			b = append(b, '.')
			b = strconv.AppendInt(b, int64(p.Subcomponent), 10)
		}
	}
	return string(b)
}
