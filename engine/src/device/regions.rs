//! Registrations, as every device keeps them: a domain's table, shared by
//! its queues (set-up work, under the domain's lock where it has one), and
//! the regions one queue attached (read on the hot path: an index and a
//! check, nothing more).

use super::{DeviceError, Mr, MrId};

/// A registration of a domain: its [`Mr`], what a queue that attaches it
/// gets (`T`: its memory), and who keeps it alive.
#[derive(Debug)]
pub(crate) struct Registration<T> {
    pub(crate) mr: Mr,
    pub(crate) region: T,
    /// Queues that attached it.
    queues: u32,
    /// Registered on the domain, which keeps it until it deregisters it;
    /// otherwise it ends with its last queue.
    held: bool,
}

/// A domain's registrations, by `MrId` (a freed id is used again).
#[derive(Debug)]
pub(crate) struct Registrations<T>(Vec<Option<Registration<T>>>);

impl<T> Default for Registrations<T> {
    fn default() -> Self {
        Registrations(Vec::new())
    }
}

impl<T> Registrations<T> {
    /// Whether a registration has `key` (keys are unique in a domain).
    pub(crate) fn has_key(&self, key: u64) -> bool {
        self.find_key(key).is_some()
    }

    /// The registration whose key is `key`.
    #[inline]
    pub(crate) fn find_key(&self, key: u64) -> Option<&Registration<T>> {
        self.0.iter().flatten().find(|r| r.mr.key == key)
    }

    /// Adds the registration `make` builds for the id it is given, used by
    /// `queues` queues: none, and the domain holds it until
    /// [`Registrations::deregister`]; one, and it ends with that queue.
    pub(crate) fn insert(&mut self, queues: u32, make: impl FnOnce(MrId) -> (Mr, T)) -> &T {
        let index = self.0.iter().position(Option::is_none).unwrap_or(self.0.len());
        let (mr, region) = make(MrId(index as u32));
        let entry = Some(Registration { mr, region, queues, held: queues == 0 });
        if index == self.0.len() {
            self.0.push(entry);
        } else {
            self.0[index] = entry;
        }
        &self.0[index].as_ref().expect("inserted above").region
    }

    /// Registration `mr`, if it is that one (not a stale or forged copy).
    pub(crate) fn get(&self, mr: &Mr) -> Option<&Registration<T>> {
        self.0.get(mr.id.0 as usize)?.as_ref().filter(|r| r.mr == *mr)
    }

    /// A queue starts using registration `mr`.
    pub(crate) fn attach(&mut self, mr: &Mr) -> Result<&T, DeviceError> {
        let r = self.0.get_mut(mr.id.0 as usize).and_then(Option::as_mut);
        let r = r.filter(|r| r.mr == *mr).ok_or(DeviceError::UnknownHandle)?;
        r.queues += 1;
        Ok(&r.region)
    }

    /// A queue stops using registration `id`; returns the registration if
    /// that ended it (its last queue, and the domain does not hold it).
    pub(crate) fn detach(&mut self, id: MrId) -> Option<Registration<T>> {
        let slot = self.0.get_mut(id.0 as usize)?;
        let r = slot.as_mut()?;
        r.queues = r.queues.saturating_sub(1);
        if r.queues == 0 && !r.held { slot.take() } else { None }
    }

    /// Ends registration `mr`, which the domain holds; [`DeviceError::Busy`]
    /// while a queue still uses it.
    pub(crate) fn deregister(&mut self, mr: &Mr) -> Result<Registration<T>, DeviceError> {
        let slot = self.0.get_mut(mr.id.0 as usize).ok_or(DeviceError::UnknownHandle)?;
        match slot {
            Some(r) if r.mr == *mr && r.queues > 0 => Err(DeviceError::Busy),
            Some(r) if r.mr == *mr => Ok(slot.take().expect("matched above")),
            _ => Err(DeviceError::UnknownHandle),
        }
    }
}

/// A region as one queue uses it.
#[derive(Debug)]
struct Local<T> {
    region: T,
    /// Work posted on this queue that reads or writes it.
    busy: u32,
}

/// The regions one queue attached, by `MrId` (its domain's ids).
#[derive(Debug)]
pub(crate) struct Attached<T>(Vec<Option<Local<T>>>);

impl<T> Default for Attached<T> {
    fn default() -> Self {
        Attached(Vec::new())
    }
}

impl<T> Attached<T> {
    /// Region `id`, if attached.
    #[inline(always)]
    pub(crate) fn get(&self, id: MrId) -> Option<&T> {
        match self.0.get(id.0 as usize) {
            Some(Some(r)) => Some(&r.region),
            _ => None,
        }
    }

    /// Region `id`; panics if it is not attached (the caller's bug: the
    /// endpoint checks spans before it copies).
    #[inline(always)]
    pub(crate) fn expect(&self, id: MrId) -> &T {
        match self.get(id) {
            Some(r) => r,
            None => unregistered(id),
        }
    }

    pub(crate) fn contains(&self, id: MrId) -> bool {
        self.get(id).is_some()
    }

    /// Uses `region` as `id` from now on.
    pub(crate) fn insert(&mut self, id: MrId, region: T) {
        let i = id.0 as usize;
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some(Local { region, busy: 0 });
    }

    /// Attaches `id`, from `domain` (its domain's attach), unless it is
    /// attached already.
    pub(crate) fn attach(
        &mut self,
        id: MrId,
        domain: impl FnOnce() -> Result<T, DeviceError>,
    ) -> Result<(), DeviceError> {
        if !self.contains(id) {
            self.insert(id, domain()?);
        }
        Ok(())
    }

    /// Stops using region `id`; [`DeviceError::Busy`] while posted work
    /// uses it.
    pub(crate) fn remove(&mut self, id: MrId) -> Result<T, DeviceError> {
        let slot = self.0.get_mut(id.0 as usize).ok_or(DeviceError::UnknownHandle)?;
        match slot {
            Some(r) if r.busy > 0 => Err(DeviceError::Busy),
            Some(_) => Ok(slot.take().expect("matched above").region),
            None => Err(DeviceError::UnknownHandle),
        }
    }

    /// One more operation posted on this queue uses region `id`.
    pub(crate) fn mark_busy(&mut self, id: MrId) {
        if let Some(Some(r)) = self.0.get_mut(id.0 as usize) {
            r.busy += 1;
        }
    }

    /// `n` fewer operations use region `id`.
    pub(crate) fn unmark_busy(&mut self, id: MrId, n: u32) {
        if let Some(Some(r)) = self.0.get_mut(id.0 as usize) {
            r.busy -= n;
        }
    }

    /// Detaches every region, each id handed to `detach` (the domain's).
    pub(crate) fn clear(&mut self, mut detach: impl FnMut(MrId)) {
        for (i, slot) in self.0.iter_mut().enumerate() {
            if slot.take().is_some() {
                detach(MrId(i as u32));
            }
        }
    }
}

/// A region looked up that is not attached: the caller's bug.
#[cold]
#[inline(never)]
fn unregistered(mr: MrId) -> ! {
    panic!("{mr:?} is not registered")
}
