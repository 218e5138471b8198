//! The channel directory: channels and threads, keyed by chat id.

use crate::protocol::{Channel, ChannelKind};

use super::base::{from_json, to_json, Result};
use super::engine::handle::Store;

/// The channel every fresh gateway starts with. It is the default until the user picks another.
pub const DEFAULT_CHAT_ID: &str = "default";

impl Store {
    /// Every directory entry: the default channel first, then in creation order (chat ids are
    /// minted time-ordered, so key order is creation order).
    pub fn channels(&self) -> Result<Vec<Channel>> {
        let mut out = Vec::new();
        for item in self.t()?.channels.iter() {
            let (_, v) = item?;
            out.push(from_json::<Channel>(&v, "channel")?);
        }
        out.sort_by_key(|c| !c.is_default);
        Ok(out)
    }

    pub fn channel(&self, chat_id: &str) -> Result<Option<Channel>> {
        match self.t()?.channels.get(chat_id.as_bytes())? {
            Some(v) => Ok(Some(from_json(&v, "channel")?)),
            None => Ok(None),
        }
    }

    /// There is always exactly one default channel: repair the directory at open if a crash or
    /// an older layout left none (or more than one).
    pub(super) fn ensure_default_channel(&self) -> Result<()> {
        let all = self.channels()?;
        let defaults: Vec<&Channel> = all.iter().filter(|c| c.is_default).collect();
        if defaults.len() == 1 {
            return Ok(());
        }
        self.writable()?;
        let t = self.t()?;
        for extra in defaults.iter().skip(1) {
            let mut c = (*extra).clone();
            c.is_default = false;
            c.kind = ChannelKind::Channel;
            t.channels.insert(c.chat_id.as_bytes(), to_json(&c))?;
        }
        if defaults.is_empty() {
            let mut c = self.channel(DEFAULT_CHAT_ID)?.unwrap_or_else(|| {
                Channel::new(
                    DEFAULT_CHAT_ID.into(),
                    "General".into(),
                    ChannelKind::Default,
                    None,
                )
            });
            c.is_default = true;
            c.kind = ChannelKind::Default;
            c.automation = false;
            t.channels.insert(c.chat_id.as_bytes(), to_json(&c))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_store;
    use super::*;

    #[test]
    fn a_fresh_store_has_one_default_channel() {
        let (_d, s) = temp_store();
        let all = s.channels().unwrap();
        assert_eq!(all.len(), 1);
        assert!(all[0].is_default);
        assert_eq!(all[0].chat_id, DEFAULT_CHAT_ID);
    }
}
