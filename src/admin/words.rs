//! Messages in the owner's words: a system error's own text ("No space left on device (os
//! error 28)") put as a sentence an owner understands ("the disk it writes to is full").

/// What an owner understands by each system error an admin action can meet, by its code.
const OS_ERRORS: [(i32, &str); 14] = [
    (libc::ENOSPC, "the disk it writes to is full"),
    (libc::EDQUOT, "the disk it writes to is full for this user"),
    (
        libc::EROFS,
        "the disk is read-only (a locked USB stick, or a worn SD card the system stopped writing)",
    ),
    (libc::EACCES, "the gateway is not allowed to use that place"),
    (libc::EPERM, "the gateway is not allowed to do that"),
    (libc::ENOENT, "it is not there"),
    (libc::ENOTDIR, "a part of that path is a file, not a folder"),
    (libc::EISDIR, "that is a folder, not a file"),
    (
        libc::EIO,
        "the disk could not be read or written (it may be failing)",
    ),
    (libc::ENAMETOOLONG, "the name is too long"),
    (libc::ECONNREFUSED, "nothing answers at that address"),
    (libc::ETIMEDOUT, "it did not answer in time"),
    (
        libc::EHOSTUNREACH,
        "that address cannot be reached from here",
    ),
    (libc::ENETUNREACH, "the network cannot be reached from here"),
];

/// A system error as an owner says it ("the disk it writes to is full"), else its own text.
pub(super) fn io_words(e: &std::io::Error) -> String {
    e.raw_os_error()
        .and_then(|code| OS_ERRORS.iter().find(|(c, _)| *c == code))
        .map_or_else(|| e.to_string(), |(_, words)| (*words).to_owned())
}

/// `text` with every system error's own wording ("No space left on device (os error 28)", as
/// `std::io::Error` prints it) replaced by [`io_words`]'s; messages are built from errors as
/// text in many places, so this is the one place they are all put in the owner's words.
pub(super) fn owner_words(text: &str) -> String {
    if !text.contains("(os error ") {
        return text.to_owned();
    }
    let mut out = text.to_owned();
    for (code, _) in OS_ERRORS {
        let raw = std::io::Error::from_raw_os_error(code);
        out = out.replace(&raw.to_string(), &io_words(&raw));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_errors_are_put_in_the_owners_words() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let said = owner_words(&format!("cannot save settings.toml: {full}"));
        assert_eq!(
            said,
            "cannot save settings.toml: the disk it writes to is full"
        );
        assert_eq!(io_words(&full), "the disk it writes to is full");
        // Text with no system error is left as it is.
        assert_eq!(owner_words("a plain sentence"), "a plain sentence");
    }
}
