package emu

// Name checks, written out rather than as package-level regexps so that
// every mosto command does not compile them at start.

// validHostName: ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$
func validHostName(s string) bool {
	if len(s) == 0 || len(s) > 63 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// validCongestion: ^[a-z0-9_]{1,15}$
func validCongestion(s string) bool {
	return validLower(s, 15, true)
}

// validRunID: ^[a-z0-9]{1,6}$
func validRunID(s string) bool {
	return validLower(s, 6, false)
}

func validLower(s string, maxLen int, underscore bool) bool {
	if len(s) == 0 || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || underscore && c == '_') {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
